"""Predicted async gain on hand-made sync step sequences."""

from __future__ import annotations

import pytest
from test_gaps import step, sync_steps

from telemetry.predict import predict_async


def test_gpu_bound_sync_run_predicts_the_device_time() -> None:
    # Each 100 us sync step: CPU work 5+10+5+14 = 34 us, compute 50 us (+ 6 us launch that
    # async hides behind the step before).
    p = predict_async(sync_steps(count=10))
    assert p.steps == 10
    assert p.sync_s == pytest.approx(1000e-6)
    assert p.cpu_s == pytest.approx(340e-6) and p.device_s == pytest.approx(500e-6)
    assert p.predicted_async_s == pytest.approx(500e-6)
    assert p.saving_s == pytest.approx(500e-6)
    assert p.cpu_exposed_async_s == 0
    assert p.speedup == pytest.approx(2.0)


def test_cpu_bound_sync_run_keeps_the_cpu_on_the_critical_path() -> None:
    recs = [step(k, cpu_prepare=(100 * k, 100 * k + 70), compute=(100 * k + 70, 100 * k + 90),
                 cpu_post=(100 * k + 90, 100 * k + 100)) for k in range(4)]
    p = predict_async(recs)
    assert p.predicted_async_s == pytest.approx(4 * 80e-6)  # CPU 80 us > device 20 us
    assert p.cpu_exposed_async_s == pytest.approx(4 * 60e-6)


def test_refuses_async_or_empty_windows() -> None:
    recs = sync_steps()
    recs[1].mode = "async"
    with pytest.raises(ValueError, match="sync mode"):
        predict_async(recs)
    with pytest.raises(ValueError, match="telemetry on"):
        predict_async([])
