"""The prefill tax on a real engine (CPU, the tiny model): a long prompt arrives beside 8 running
streams, and the streams' measured inter-token latency during its chunk steps matches what the
step-time fit, made over the same run without those steps, predicts within the fit's own 95%
interval; a fit that knows nothing of the chunks misses it. No figure is a fixed target: the
fit and the measurement come from one run on whatever load the machine has."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.suites.prefill_tax import STREAMS, penalty_check, run_scenario
from telemetry.prefill_tax import TaxFit, fit_step_time, itl_by_kind, what_if

MODEL = Path(__file__).resolve().parents[2] / "models" / "gapless-tiny-python"


@pytest.fixture(scope="module")
def scenario():
    if not (MODEL / "config.json").exists():
        pytest.skip(f"{MODEL} is missing (the setup makes it)")
    return run_scenario(str(MODEL))


def test_the_long_prompts_chunks_cost_the_streams_what_the_fit_predicts(scenario):
    check = penalty_check(scenario)
    assert check.chunk_steps >= 24  # 6 rounds of a 1000-token prompt in 256-token chunks
    assert "prefill" in check.terms
    # the streams' measured ITL in the held-out chunk steps lies inside the fit's own 95%
    # prediction intervals, step by step, for two thirds of them at least
    assert check.holds, check
    # and the tax is there: the predicted chunk steps stand far above the same steps without
    # their chunk, as the measured ones do
    assert check.lo_ms > check.baseline_ms + 3 * check.rmse_ms or \
        check.predicted_penalty_ms > 2 * check.baseline_ms, check
    assert check.measured_penalty_ms > check.predicted_penalty_ms / 2, check


def test_a_fit_that_never_saw_a_chunk_mispredicts_them(scenario):
    """The negative control: the step time of the decode-only steps (as measured between
    prefills) puts the chunk steps outside its intervals."""
    blind = penalty_check(scenario, terms=("decode",), decode_only=True)
    assert "prefill" not in blind.terms
    assert not blind.holds, blind
    assert blind.measured_itl_ms > blind.hi_ms, blind


def test_the_streams_see_slower_steps_with_a_chunk_and_the_what_if_reads_the_run(scenario):
    recs = scenario.records
    itl = itl_by_kind(recs, window_steps=len(recs))
    assert itl.with_prefill.count >= 12 and itl.decode_only.count >= 20
    assert itl.with_prefill.p50 > itl.decode_only.p50
    fit = fit_step_time(recs, window_steps=len(recs))
    assert isinstance(fit, TaxFit) and fit.has("prefill")
    none, own = what_if(fit, recs, [STREAMS, STREAMS + 256])
    assert "no room" in none.note
    # at its own budget the run served its prompts: the what-if says the demand is met
    assert own.note == "" and own.tokens_per_s > 0 and own.p99_itl_ms > 0
