"""The token budget's what-if, in numbers: the predicted p99 inter-token latency (ITL) and
throughput at a few budgets, and, for a budget change, the prediction taken before it beside
the measurement after it.

Owns what the what-if panel (ui/widgets/token_budget.py) shows and the state that keeps a
prediction across the change (``BudgetWatch``). The fit and the prediction are
telemetry/prefill_tax.py's (``fit_step_time``, ``what_if``), and so is a step's time (its
period, ``timed_steps``: what a running request waits between two tokens); this module only
picks the budgets, keeps the prediction and measures the steps run at the new budget the
same way. Pure functions over StepRecords: never Streamlit, never the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from telemetry.prefill_tax import (
    WINDOW_STEPS,
    BudgetPrediction,
    NoFit,
    fit_step_time,
    timed_steps,
    what_if,
)
from telemetry.records import StepRecord

MIN_MEASURED_STEPS = 32  # steps run at the new budget before their figures are shown
KEPT_TRIALS = 4  # budget changes kept on the panel, newest first


@dataclass(slots=True, frozen=True)
class Measured:
    """What ``steps`` steps run at ``budget`` gave: the 99th percentile of the periods of the
    steps that carried decode tokens (the ITL a running request saw) and the tokens they
    carried per second of wall time."""

    budget: int
    steps: int
    p99_itl_ms: float
    tokens_per_s: float


def measure(records: Sequence[StepRecord], budget: int, after_step: int = -1) -> Measured | None:
    """The steps after ``after_step`` scheduled under ``budget``, measured; None without a
    timed step among them."""
    timed = {t.step: t for t in timed_steps(records)}
    ends = {r.step: r.end_ns for r in records if r.spans}
    mine = sorted(r.step for r in records
                  if r.step > after_step and r.token_budget == budget and r.step in timed)
    if not mine:
        return None
    itl = [timed[s].time_ns for s in mine if timed[s].decode_tokens > 0]
    tokens = sum(timed[s].decode_tokens + timed[s].prefill_tokens for s in mine)
    # Wall time from where the first measured step's period began to the last one's end:
    # the idle time between steps counts (a user's tokens/s), the steps before do not.
    first = timed[mine[0]]
    start = (ends[mine[0]] or 0) - first.time_ns
    wall_ns = (ends[mine[-1]] or 0) - start
    p99 = float(np.percentile(itl, 99)) / 1e6 if itl else float("nan")
    return Measured(budget, len(mine), p99, tokens * 1e9 / wall_ns if wall_ns > 0 else 0.0)


def what_if_budgets(current: int, budget_range: Sequence[int]) -> list[int]:
    """The budgets the panel predicts: the lowest and highest the engine allows, the current
    one, and half and twice it; sorted, each once."""
    low, high = int(budget_range[0]), int(budget_range[1])
    picks = {low, high, current, current // 2, current * 2}
    return sorted(b for b in picks if low <= b <= high)


def predictions(records: Sequence[StepRecord],
                budgets: Sequence[int]) -> tuple[list[BudgetPrediction], str]:
    """telemetry.prefill_tax's what-if over the last WINDOW_STEPS of ``records`` at each
    budget, or no predictions and why."""
    window = list(records)[-WINDOW_STEPS:]
    fit = fit_step_time(window)
    if isinstance(fit, NoFit):
        return [], fit.reason
    try:
        return what_if(fit, window, list(budgets)), ""
    except ValueError as e:  # a window without two timed steps
        return [], str(e)


@dataclass(slots=True)
class BudgetTrial:
    """One budget change: the prediction at the new budget (and at the old one) made from the
    steps run before the change, and the steps run after it, measured."""

    before: int
    after: int
    last_step_before: int  # steps after this one, at `after`, are the trial's
    predicted: BudgetPrediction | None
    predicted_before: BudgetPrediction | None
    measured_before: Measured | None
    reason: str = ""  # why there is no prediction
    measured: Measured | None = None  # None until MIN_MEASURED_STEPS ran at `after`

    @property
    def steps_after(self) -> int:
        return 0 if self.measured is None else self.measured.steps


@dataclass(slots=True)
class BudgetWatch:
    """The budget as last seen and the changes seen, for one view of one engine process.

    ``observe`` takes the budget in force and the newest step records at each refresh. A
    budget unlike the last one seen is a change, whoever made it: its prediction is taken
    then, from the steps scheduled under the old budget only (so none of the new budget's
    steps informs it), and kept; every later refresh measures the steps scheduled under the
    new budget, shown once MIN_MEASURED_STEPS of them ran. A new engine process (a restart:
    its steps count from 0 again) starts the watch afresh."""

    engine: object = None
    seen: int | None = None
    trials: list[BudgetTrial] = field(default_factory=list)  # newest first

    def observe(self, budget: int, records: Sequence[StepRecord], engine: object = None) -> None:
        if engine != self.engine:
            self.engine, self.seen, self.trials = engine, None, []
        if self.seen is not None and budget != self.seen:
            self.trials.insert(0, start_trial(self.seen, budget, records))
            del self.trials[KEPT_TRIALS:]
        self.seen = budget
        if self.trials and self.trials[0].after == budget:
            # The newest change, still in force: measured over every step run under it that
            # the records hold (a later, shorter reading, once old steps left, is not taken).
            trial = self.trials[0]
            got = measure(records, trial.after, trial.last_step_before)
            if got is not None and got.steps >= max(MIN_MEASURED_STEPS, trial.steps_after):
                trial.measured = got


def start_trial(before: int, after: int, records: Sequence[StepRecord]) -> BudgetTrial:
    """The trial of a change from ``before`` to ``after``: predictions at both from the steps
    scheduled under ``before`` (the window up to the change)."""
    old = [r for r in records if r.token_budget == before]
    last = max((r.step for r in old), default=-1)
    preds, reason = predictions(old, [after, before])
    by_budget = {p.budget: p for p in preds}
    return BudgetTrial(before=before, after=after, last_step_before=last,
                       predicted=by_budget.get(after), predicted_before=by_budget.get(before),
                       measured_before=measure(old[-WINDOW_STEPS:], before),
                       reason=reason)


def _ms(x: float | None) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.1f}"


def _tps(x: float | None) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:,.0f}"


def prediction_rows(preds: Sequence[BudgetPrediction], current: int) -> list[dict[str, str]]:
    """The what-if table: one row a budget, the one in force marked."""
    return [{"budget (tokens)": f"{p.budget}{' (now)' if p.budget == current else ''}",
             "predicted p99 ITL (ms)": _ms(p.p99_itl_ms),
             "predicted tokens/s": _tps(p.tokens_per_s),
             "note": p.note or ""} for p in preds]


def trial_rows(trials: Sequence[BudgetTrial]) -> list[dict[str, str]]:
    """The changes table: per change, a row at the new budget (the prediction taken before
    the change beside the measurement after it, a dash until enough steps ran), then a row at
    the old budget (the same fit's prediction there beside what its steps measured: how well
    the model fits the steps it was made from)."""
    rows = []
    for t in trials:
        change = f"{t.before} → {t.after}"
        for budget, p, m, when in ((t.after, t.predicted, t.measured, "after"),
                                   (t.before, t.predicted_before, t.measured_before, "before")):
            rows.append({
                "change": change,
                "budget (tokens)": f"{budget} ({when})",
                "predicted p99 ITL (ms)": _ms(p.p99_itl_ms if p else None),
                "measured p99 ITL (ms)": _ms(m.p99_itl_ms if m else None),
                "predicted tokens/s": _tps(p.tokens_per_s if p else None),
                "measured tokens/s": _tps(m.tokens_per_s if m else None),
                "steps measured": str(m.steps) if m else f"under {MIN_MEASURED_STEPS}",
                "note": t.reason or (p.note if p else ""),
            })
    return rows
