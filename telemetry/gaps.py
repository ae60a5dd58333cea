"""Idle by cause: every gap on the compute lane, labelled with what the GPU waited for.

Owns the attribution of compute-idle time. A gap ends when the next step's compute starts;
what the GPU waited for at each instant of the gap is the latest stage of that step's
chain (and of the step before it) that was running then, by this priority:

    graph_launch   the step's compute.launch span (the stream reached the step; the graph's
                   first kernel had not started: launch latency)
    h2d            the step's H2D input copy
    cpu            the step's CPU work: cpu.launch, cpu.prepare, cpu.schedule, and the CPU's
                   stretches between them (a slot wait, bookkeeping)
    previous_step  the CPU waiting for and posting the step it read just before scheduling
                   this one (cpu.wait, cpu.post), and in sync mode that step's D2H copy:
                   sync mode's serial tail. In async mode with 2+ slots that is the step
                   two back (the loop reads step N after launching N+1), and the D2H of the
                   step just before never counts: nothing waits for it
    no_work        none of the above: nothing was queued (an idle engine, or a leading gap
                   before the first step of the window, or the trailing one after the last)

So ``sum(by_cause.values()) == idle_ns == window - busy`` (compute lane, same union as
telemetry.metrics.busy_fraction). The one attribution of idle time: the Live page's gauges
and waterfall (telemetry.waterfall), the A/B and Recordings pages (ui.figures.window_stats) and the
benchmark workload all call it. Pure functions over StepRecords: no clocks, no bus, no UI,
nothing of ours beyond telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from telemetry.metrics import busy_intervals, spans_of
from telemetry.records import StepRecord

CAUSES: tuple[str, ...] = ("cpu", "graph_launch", "h2d", "previous_step", "no_work")
CAUSE_LABELS: dict[str, str] = {
    "cpu": "CPU schedule/prepare/launch",
    "graph_launch": "graph launch",
    "h2d": "H2D copy",
    "previous_step": "D2H/CPU post of the previous step",
    "no_work": "no work queued",
}
# (lane, cause) from the highest priority down; "own" lanes belong to the step whose compute
# ends the gap, "previous" lanes to the step before it.
_OWN = (("compute.launch", "graph_launch"), ("h2d", "h2d"), ("cpu.launch", "cpu"),
        ("cpu.prepare", "cpu"), ("cpu.schedule", "cpu"))
_PREVIOUS = (("d2h", "previous_step"), ("cpu.post", "previous_step"),
             ("cpu.wait", "previous_step"))


@dataclass(slots=True, frozen=True)
class LabelledGap:
    """One idle stretch of the compute lane; ``causes`` maps cause -> ns (sums to the gap),
    ``cause`` is the largest of them, ``step`` the step whose compute ended the gap (None
    for a trailing gap)."""

    start_ns: int
    end_ns: int
    cause: str
    causes: dict[str, int]
    step: int | None


@dataclass(slots=True)
class IdleBreakdown:
    window_ns: int
    idle_ns: int
    by_cause: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    gaps: list[LabelledGap] = field(default_factory=list)

    def share(self, cause: str) -> float:
        """Fraction of the window idle for ``cause`` (0.0 for a zero-length window)."""
        return self.by_cause.get(cause, 0) / self.window_ns if self.window_ns else 0.0

    def largest(self) -> LabelledGap | None:
        return max(self.gaps, key=lambda g: g.end_ns - g.start_ns, default=None)


def _attribute(lo: int, hi: int, chain: list[tuple[int, int, str]]) -> dict[str, int]:
    """Split [lo, hi) by the highest-priority chain span covering each instant. ``chain``
    is (start, end, cause) in priority order. Uncovered time after the step's first own
    span (its CPU work) counts as "cpu" (the CPU between phases), before it as "no_work"."""
    own_start = min((s for s, _, c in chain if c != "previous_step"), default=None)
    inside = [(max(s, lo), min(e, hi), c) for s, e, c in chain if s < hi and e > lo]
    out: dict[str, int] = {}
    if not inside and (own_start is None or own_start >= hi or own_start <= lo):
        cause = "cpu" if own_start is not None and own_start <= lo else "no_work"
        out[cause] = hi - lo
        return out
    points = sorted({lo, hi, *(s for s, _, _ in inside), *(e for _, e, _ in inside)}
                    | ({own_start} if own_start is not None and lo < own_start < hi else set()))
    for a, b in zip(points, points[1:], strict=False):
        cause = None
        for s, e, c in inside:
            if s <= a and e >= b:
                cause = c
                break
        if cause is None:
            cause = "cpu" if own_start is not None and a >= own_start else "no_work"
        out[cause] = out.get(cause, 0) + (b - a)
    return out


_OWN_LANES = dict(_OWN)
_OWN_RANK = {lane: i for i, (lane, _) in enumerate(_OWN)}
_PREV_LANES = dict(_PREVIOUS)
_PREV_RANK = {lane: i for i, (lane, _) in enumerate(_PREVIOUS)}
_ASYNC_PREV_LANES = {"cpu.post": "previous_step", "cpu.wait": "previous_step"}


def _handled_before(rec: StepRecord, by_step: dict[int, StepRecord],
                    ) -> tuple[StepRecord | None, dict[str, str]]:
    """The step whose results the CPU waited for and posted just before it scheduled
    ``rec``, and which of its lanes count. Sync (and async with one slot, where a slot's
    last step is read before reuse): the step before, D2H included. Async with more slots:
    the step two back (the loop reads step N after launching N+1), its D2H not counted:
    the GPU never waits for it."""
    prev = by_step.get(rec.step - 1)
    if rec.mode == "sync" or (prev is not None and prev.slot == rec.slot):
        return prev, _PREV_LANES
    return by_step.get(rec.step - 2), _ASYNC_PREV_LANES


def idle_by_cause(records: Sequence[StepRecord], window_start_ns: int,
                  window_end_ns: int) -> IdleBreakdown:
    """Label every compute-lane gap inside the window and sum the idle time per cause.

    ``records`` may come in any order; steps are matched to gaps by their compute spans.
    Raises ValueError when the window ends before it starts.
    """
    starts, ends = busy_intervals(spans_of(records), window_start_ns, window_end_ns)
    out = IdleBreakdown(window_ns=window_end_ns - window_start_ns, idle_ns=0)
    if out.window_ns == 0:
        return out
    by_step = {r.step: r for r in records}
    # The step whose compute opens each busy interval: the earliest compute span start there.
    opener: dict[int, StepRecord] = {}
    for r in records:
        for s in r.spans:
            if s.lane == "compute":
                begin = max(s.start_ns, window_start_ns)
                known = opener.get(begin)
                if known is None or r.step < known.step:
                    opener[begin] = r
    gap_lo = [window_start_ns, *ends.tolist()]
    gap_hi = [*starts.tolist(), window_end_ns]
    for lo, hi in zip(gap_lo, gap_hi, strict=True):
        if hi <= lo:
            continue
        rec = opener.get(hi)
        chain: list[tuple[int, int, str]] = []
        if rec is not None:
            own = [s for s in rec.spans if s.lane in _OWN_LANES]
            own.sort(key=lambda s: _OWN_RANK[s.lane])
            chain = [(s.start_ns, s.end_ns, _OWN_LANES[s.lane]) for s in own]
            prev, lanes = _handled_before(rec, by_step)
            if prev is not None:
                back = [s for s in prev.spans if s.lane in lanes]
                back.sort(key=lambda s: _PREV_RANK[s.lane])
                chain += [(s.start_ns, s.end_ns, "previous_step") for s in back]
        causes = _attribute(lo, hi, chain)
        for cause, ns in causes.items():
            out.by_cause[cause] = out.by_cause.get(cause, 0) + ns
        out.idle_ns += hi - lo
        main = max(causes, key=lambda c: causes[c])
        out.gaps.append(LabelledGap(lo, hi, main, causes, rec.step if rec else None))
    return out
