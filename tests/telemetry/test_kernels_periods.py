"""Sampled steps against the others: their periods, and the busy of unperturbed steps
estimated from the samples' kernel time per step over the other steps' period."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from telemetry.kernels import KernelRecord, KernelSample, SampledStep, sampled_step_periods


def test_sampled_steps_are_compared_with_steps_away_from_any_sample():
    # step i computes from i*i us: periods 1, 3, 5, ... us (step 4's is 9 us, step 5's 11)
    records = [SimpleNamespace(step=i, spans=[SimpleNamespace(
        lane="compute", start_ns=1000 * i * i, end_ns=1000 * i * i + 10)]) for i in range(10)]
    sample = KernelSample([SampledStep(4, [KernelRecord("k", "gemm", 0, 2000)]),
                           SampledStep(5, [KernelRecord("k", "gemm", 0, 1000)])], (0, 10), 10)
    out = sampled_step_periods(records, [sample])
    assert out["period_us_sampled"] == 10.0  # median of 9 and 11
    # others: steps 0, 1, 2, 7, 8 (3..6 are sampled or next to one): 1, 3, 5, 15, 17 us
    assert out["period_us_other"] == 5.0
    assert out["busy_unperturbed_estimate"] == pytest.approx(1.5 / 5)
    assert out["kernels_per_sampled_step"] == [1, 1]
    assert sampled_step_periods(records, [])["busy_unperturbed_estimate"] is None
