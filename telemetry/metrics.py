"""Pure metrics over spans and step records: GPU busy fraction, idle gaps, throughput, gauges.

Owns the arithmetic the dashboard and the benchmarks quote, so that both quote the same
numbers. Every function is pure (no clocks, no globals, inputs untouched) and vectorised
with numpy, so thousands of spans cost well under a millisecond beyond the unavoidable
attribute reads. Request latency figures live in telemetry/latency.py and are re-exported
here.

It must never read the bus, the clock or the GPU itself, and never import a UI library.

Windows are half-open host-clock intervals ``[window_start_ns, window_end_ns)`` in
time.perf_counter_ns() nanoseconds. A window with start > end is an error; a zero-length
window is allowed and has busy fraction 0.0 and no gaps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from telemetry.latency import (
    Distribution,
    LatencySummary,
    RequestLatency,
    distribution,
    request_latencies,
    summarize_latencies,
)
from telemetry.records import Span, StepRecord

__all__ = [
    "Distribution",
    "GapStats",
    "LatencySummary",
    "RequestLatency",
    "StepGauges",
    "StepTotals",
    "busy_fraction",
    "busy_intervals",
    "distribution",
    "idle_gaps",
    "record_end_ns",
    "request_latencies",
    "spans_of",
    "step_gauges",
    "step_totals",
    "summarize_latencies",
    "tokens_per_second",
]


class GapStats(NamedTuple):
    """Idle stretches of one lane inside a window (see idle_gaps for what counts)."""

    count: int
    total_ns: int
    largest_ns: int


def spans_of(records: Iterable[StepRecord]) -> list[Span]:
    """All spans of the given step records, flattened in record order."""
    return [s for r in records for s in r.spans]


def _check_window(window_start_ns: int, window_end_ns: int) -> None:
    if window_end_ns < window_start_ns:
        raise ValueError(
            f"window end {window_end_ns} is before its start {window_start_ns}; "
            "pass (start_ns, end_ns) with start <= end"
        )


def busy_intervals(
    spans: Iterable[Span], window_start_ns: int, window_end_ns: int, lane: str = "compute"
) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``lane``'s spans clipped to the window, as disjoint sorted intervals.

    Returns ``(starts, ends)`` int64 arrays. Spans that touch (one ends where the next
    begins) merge into one interval: a zero-length gap is not idle time.
    """
    _check_window(window_start_ns, window_end_ns)
    pairs = [(s.start_ns, s.end_ns) for s in spans if s.lane == lane]
    if not pairs:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty.copy()
    arr = np.asarray(pairs, dtype=np.int64)
    starts = np.clip(arr[:, 0], window_start_ns, window_end_ns)
    ends = np.clip(arr[:, 1], window_start_ns, window_end_ns)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # furthest end seen so far
    opens = np.empty(starts.size, dtype=bool)
    opens[0] = True
    opens[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (overlaps count once), in their
    own unit: int in, int out. The one interval union every kernel-busy figure sums."""
    total, reach = 0, None
    for a, b in sorted(intervals):
        if reach is None or a > reach:
            total += b - a
            reach = b
        elif b > reach:
            total += b - reach
            reach = b
    return total


def busy_fraction(
    spans: Iterable[Span], window_start_ns: int, window_end_ns: int, lane: str = "compute"
) -> float:
    """Length of the union of ``lane``'s spans inside the window / the window's length.

    Overlapping spans count once, so the result is in [0, 1]. With lane="compute" this is
    *step busy* (a graph step's span runs from its first kernel to its last; time inside
    kernels, *kernel busy*, needs a kernel recording: telemetry.anatomy). NVML's utilisation
    reads higher (it counts sample periods in which any kernel ran). A zero-length window
    gives 0.0.
    """
    starts, ends = busy_intervals(spans, window_start_ns, window_end_ns, lane)
    length = window_end_ns - window_start_ns
    if length == 0:
        return 0.0
    return float(np.sum(ends - starts)) / length


def idle_gaps(
    spans: Iterable[Span], window_start_ns: int, window_end_ns: int, lane: str = "compute"
) -> GapStats:
    """Idle stretches of ``lane`` inside the window.

    Counted: every gap between consecutive busy intervals (the union of the lane's spans),
    plus the leading idle stretch from the window start to the first busy interval and the
    trailing one from the last busy interval to the window end, when they are non-empty. So
    ``total_ns + busy_ns == window length`` always holds, and a window with no spans is one
    gap as long as the window. Edge stretches are counted because a window cut from a live
    timeline usually starts or ends inside real idle time, and leaving them out would make
    an idle lane look gap-free. Touching spans leave no gap.
    """
    starts, ends = busy_intervals(spans, window_start_ns, window_end_ns, lane)
    if window_end_ns == window_start_ns:
        return GapStats(0, 0, 0)
    gap_starts = np.concatenate(([window_start_ns], ends))
    gap_ends = np.concatenate((starts, [window_end_ns]))
    lengths = gap_ends - gap_starts
    lengths = lengths[lengths > 0]
    if lengths.size == 0:
        return GapStats(0, 0, 0)
    return GapStats(int(lengths.size), int(lengths.sum()), int(lengths.max()))


def record_end_ns(rec: StepRecord) -> int | None:
    """When a step ended (StepRecord.end_ns), or None when it has no spans."""
    return rec.end_ns


def _in_window(
    records: Iterable[StepRecord], window_start_ns: int | None, window_end_ns: int | None
) -> list[StepRecord]:
    if window_start_ns is None and window_end_ns is None:
        return list(records)
    lo = window_start_ns if window_start_ns is not None else -(2**63)
    hi = window_end_ns if window_end_ns is not None else 2**63 - 1
    _check_window(lo, hi)
    out = []
    for rec in records:
        end = record_end_ns(rec)
        if end is not None and lo <= end < hi:
            out.append(rec)
    return out


TokenKind = Literal["all", "prefill", "decode"]


def tokens_per_second(
    records: Iterable[StepRecord],
    window_start_ns: int,
    window_end_ns: int,
    which: TokenKind = "all",
) -> float:
    """Tokens processed per second by the steps that ended inside the window.

    A step belongs to the window its last span ended in (record_end_ns); steps without spans
    have no time and are left out. Padding tokens never count. ``which`` picks prefill,
    decode or both (the default). A zero-length window gives 0.0.
    """
    if which not in ("all", "prefill", "decode"):
        raise ValueError(f"which must be 'all', 'prefill' or 'decode', got {which!r}")
    _check_window(window_start_ns, window_end_ns)
    length = window_end_ns - window_start_ns
    if length == 0:
        return 0.0
    total = 0
    for rec in _in_window(records, window_start_ns, window_end_ns):
        if which == "all":
            total += rec.prefill_tokens + rec.decode_tokens
        elif which == "prefill":
            total += rec.prefill_tokens
        else:
            total += rec.decode_tokens
    return total * 1e9 / length


@dataclass(slots=True, frozen=True)
class StepGauges:
    """Engine-wide gauges as the latest step (highest step number) reported them."""

    step: int
    running: int
    waiting: int  # queue depth
    kv_blocks_used: int
    kv_blocks_total: int

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, 0.0 when the cache size is unknown (total 0)."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


def step_gauges(records: Sequence[StepRecord]) -> StepGauges | None:
    """Gauges of the step with the highest step number, or None when there are no records."""
    if not records:
        return None
    rec = max(records, key=lambda r: r.step)
    return StepGauges(
        step=rec.step,
        running=rec.running,
        waiting=rec.waiting,
        kv_blocks_used=rec.kv_blocks_used,
        kv_blocks_total=rec.kv_blocks_total,
    )


@dataclass(slots=True, frozen=True)
class StepTotals:
    """Sums over the steps of a window (or over all given steps)."""

    steps: int
    preemptions: int
    prefill_tokens: int
    decode_tokens: int
    padded_tokens: int
    graph_steps: int  # steps that ran a CUDA graph (graph_bucket is not None)
    max_waiting: int  # deepest queue seen

    @property
    def padding_fraction(self) -> float:
        """Padded tokens / all tokens run (real + padded); 0.0 with no tokens."""
        run = self.prefill_tokens + self.decode_tokens + self.padded_tokens
        return self.padded_tokens / run if run else 0.0


def step_totals(
    records: Iterable[StepRecord],
    window_start_ns: int | None = None,
    window_end_ns: int | None = None,
) -> StepTotals:
    """Sums of preemptions, tokens and graph use over the steps that ended in the window.

    With no window every record counts, including records without spans; with a window,
    only steps whose last span ended inside it (as in tokens_per_second).
    """
    recs = _in_window(records, window_start_ns, window_end_ns)
    return StepTotals(
        steps=len(recs),
        preemptions=sum(r.preemptions for r in recs),
        prefill_tokens=sum(r.prefill_tokens for r in recs),
        decode_tokens=sum(r.decode_tokens for r in recs),
        padded_tokens=sum(r.padded_tokens for r in recs),
        graph_steps=sum(1 for r in recs if r.graph_bucket is not None),
        max_waiting=max((r.waiting for r in recs), default=0),
    )
