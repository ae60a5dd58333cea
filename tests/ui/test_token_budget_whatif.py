"""The token budget's what-if (ui/figures/token_budget.py): the prediction for a new budget is
taken from the steps run before the change and kept as it was; the measurement comes from the
steps run under the new budget, once enough of them ran; a restarted engine starts afresh."""

from __future__ import annotations

import math
import random

import pytest

from telemetry.records import Span, StepRecord
from ui.figures.token_budget import (
    MIN_MEASURED_STEPS,
    BudgetWatch,
    measure,
    prediction_rows,
    predictions,
    trial_rows,
    what_if_budgets,
)

STREAMS = 8
PROMPT = 200


def simulate(budget: int, steps: int, first_step: int = 0, t0_ns: int = 0,
             base_ms: float = 5.0, per_prefill_ms: float = 0.02, seed: int = 0,
             ) -> list[StepRecord]:
    """``steps`` back-to-back steps of 8 decoding streams under ``budget``: a prompt of PROMPT
    tokens arrives every 20 steps and is cut into chunks of what the decodes leave. Each step
    takes base_ms + 0.1 ms a decode token + per_prefill_ms a prefill token, +-3% noise."""
    rng = random.Random(seed)
    out, t, left, rid = [], t0_ns, 0, 0
    for k in range(steps):
        step = first_step + k
        if k % 20 == 0:
            left, rid = PROMPT, rid + 1
        chunk = min(left, budget - STREAMS) if left else 0
        chunks = [(f"s{i}", 1, 300 + step) for i in range(STREAMS)]
        if chunk:
            chunks.append((f"p{rid}", chunk, PROMPT - left + chunk))
            left -= chunk
        ms = (base_ms + 0.1 * STREAMS + per_prefill_ms * chunk) * (1 + rng.uniform(-.03, .03))
        end = t + int(ms * 1e6)
        out.append(StepRecord(step=step, mode="async", slot=step % 2, num_requests=len(chunks),
                              prefill_tokens=chunk, decode_tokens=STREAMS,
                              spans=[Span("cpu.schedule", t, t + 10_000), Span("compute", t, end)],
                              chunks=chunks, token_budget=budget))
        t = end
    return out


def test_the_budgets_shown_are_within_the_engines_range():
    assert what_if_budgets(512, (16, 512)) == [16, 256, 512]
    assert what_if_budgets(64, (16, 512)) == [16, 32, 64, 128, 512]


def test_measure_reads_the_p99_period_and_the_tokens_per_wall_second():
    recs = simulate(64, 100)
    m = measure(recs, 64)
    assert m is not None and m.steps == 99  # the first step has no period
    periods = sorted(r.end_ns - r.spans[0].start_ns for r in recs[1:])
    assert m.p99_itl_ms == pytest.approx(periods[-1] / 1e6, rel=0.02)
    tokens = sum(r.num_tokens for r in recs[1:])
    wall = recs[-1].end_ns - recs[0].end_ns
    assert m.tokens_per_s == pytest.approx(tokens * 1e9 / wall)
    assert measure(recs, 128) is None  # no step ran at that budget


def test_predictions_come_from_the_fit_and_say_so_without_one():
    recs = simulate(512, 200)
    preds, reason = predictions(recs, [64, 512])
    assert reason == "" and [p.budget for p in preds] == [64, 512]
    # A smaller budget cuts a prompt into smaller chunks: a lower p99 ITL.
    assert preds[0].p99_itl_ms < preds[1].p99_itl_ms
    rows = prediction_rows(preds, 512)
    assert rows[1]["budget (tokens)"] == "512 (now)"
    none, why = predictions(recs[:3], [64])
    assert none == [] and why


def test_a_change_keeps_its_prediction_and_shows_the_measurement_once_enough_steps_ran():
    before = simulate(512, 200)
    watch = BudgetWatch()
    watch.observe(512, before, engine=1)
    assert watch.trials == []
    watch.observe(64, before, engine=1)  # the settings changed; no step at 64 yet
    (trial,) = watch.trials
    assert (trial.before, trial.after, trial.last_step_before) == (512, 64, 199)
    assert trial.predicted is not None and trial.measured is None
    predicted = trial.predicted
    expected, _ = predictions(before, [64])
    assert predicted == expected[0]

    # Steps under the new budget that run much slower than the model said: the prediction
    # stays what it was; the measurement waits for MIN_MEASURED_STEPS of them.
    t_end = before[-1].end_ns
    few = simulate(64, MIN_MEASURED_STEPS - 2, first_step=200, t0_ns=t_end, base_ms=20, seed=1)
    watch.observe(64, before + few, engine=1)
    assert trial.measured is None
    assert trial_rows(watch.trials)[0]["measured p99 ITL (ms)"] == "—"
    enough = simulate(64, 3 * MIN_MEASURED_STEPS, first_step=200, t0_ns=t_end, base_ms=20,
                      seed=1)
    watch.observe(64, before + enough, engine=1)
    assert trial.predicted == predicted
    assert trial.measured is not None and trial.measured.steps == len(enough)
    assert trial.measured.p99_itl_ms > 2 * predicted.p99_itl_ms  # the model was wrong here
    after, before_row = trial_rows(watch.trials)
    assert after["change"] == before_row["change"] == "512 → 64"
    assert after["budget (tokens)"] == "64 (after)"
    assert after["predicted p99 ITL (ms)"] == f"{predicted.p99_itl_ms:.1f}"
    assert after["measured p99 ITL (ms)"] == f"{trial.measured.p99_itl_ms:.1f}"
    # The old budget's row: the same fit there, beside what the steps before measured.
    assert before_row["budget (tokens)"] == "512 (before)"
    assert trial.measured_before is not None
    assert before_row["measured p99 ITL (ms)"] == f"{trial.measured_before.p99_itl_ms:.1f}"

    # The snapshot moves on and the oldest steps at 64 leave it: a shorter reading is not
    # taken over the longer one.
    watch.observe(64, enough[-MIN_MEASURED_STEPS:], engine=1)
    assert trial.measured.steps == len(enough)


def test_a_prediction_uses_no_step_of_the_new_budget():
    before = simulate(512, 200)
    after = simulate(64, 100, first_step=200, t0_ns=before[-1].end_ns, base_ms=50)
    watch = BudgetWatch()
    watch.observe(512, before, engine=1)
    watch.observe(64, before + after, engine=1)  # noticed late: steps at 64 already there
    expected, _ = predictions(before, [64])
    assert watch.trials[0].predicted == expected[0]
    assert watch.trials[0].measured is not None  # and they are measured at once


def test_a_window_without_a_fit_says_why_and_a_restart_starts_afresh():
    watch = BudgetWatch()
    short = simulate(512, 4)
    watch.observe(512, short, engine=1)
    watch.observe(64, short, engine=1)
    (trial,) = watch.trials
    assert trial.predicted is None and trial.reason
    assert trial_rows(watch.trials)[0]["note"] == trial.reason
    watch.observe(64, [], engine=2)  # another engine process: its steps count from 0
    assert watch.trials == [] and watch.seen == 64


def test_nan_figures_read_as_a_dash():
    from telemetry.prefill_tax import BudgetPrediction

    rows = prediction_rows([BudgetPrediction(16, math.nan, 10.0, "no decodes")], 16)
    assert rows[0]["predicted p99 ITL (ms)"] == "—"
