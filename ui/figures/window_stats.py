"""Figures of one window of steps, for comparing modes: steps/s, step time, CPU share, idle.

Owns the per-window arithmetic the A/B view and the recordings show: steps per second (and
per sub-window), the median step period, the device's compute time and the CPU's own work
per step (its share of a step: the most async can hide), and the compute lane's idle time by
cause. Busy and gap maths are telemetry.metrics'; idle by cause is telemetry.gaps' (the Live
page's gauges and waterfall use the same attribution, so both pages blame a gap alike).
Pure functions: no streamlit, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from telemetry.gaps import idle_by_cause
from telemetry.metrics import busy_fraction, idle_gaps
from telemetry.records import StepRecord

CPU_WORK_LANES = ("cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.post")


@dataclass(slots=True)
class WindowStats:
    label: str
    start_ns: int
    end_ns: int
    steps: int
    steps_per_s: float
    tokens_per_s: float
    step_ms: float  # median time from one step's compute start to the next's
    compute_ms: float  # median compute span
    cpu_ms: float  # median CPU work per step (schedule + prepare + launch + post)
    busy: float  # compute-lane busy fraction
    idle_ms: float
    idle_gaps: int
    largest_gap_ms: float
    idle_by_cause_ms: dict[str, float] = field(default_factory=dict)  # telemetry.gaps.CAUSES
    sub_steps_per_s: list[float] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def cpu_share(self) -> float:
        """The CPU's own work as a share of a step period (0..1, nan when unknown)."""
        return self.cpu_ms / self.step_ms if self.step_ms > 0 else float("nan")


def window_stats(
    records: Sequence[StepRecord],
    label: str,
    start_ns: int | None = None,
    end_ns: int | None = None,
    parts: int = 5,
) -> WindowStats:
    """The figures of ``records`` over [start_ns, end_ns] (default: their own extent)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    recs = [r for r in records if r.spans]
    if not recs:
        raise ValueError(f"window {label!r} has no steps")
    lo = min(s.start_ns for r in recs for s in r.spans) if start_ns is None else start_ns
    hi = max(r.end_ns for r in recs) if end_ns is None else end_ns
    if hi <= lo:
        raise ValueError(f"window {label!r} is empty: end {hi} <= start {lo}")
    inside = [r for r in recs if lo <= r.end_ns <= hi]
    spans = [s for r in recs for s in r.spans]
    length_s = (hi - lo) / 1e9
    compute_starts = np.sort(
        [s.start_ns for s in spans if s.lane == "compute" and lo <= s.start_ns <= hi]
    )
    period = np.diff(compute_starts)
    compute = [s.end_ns - s.start_ns for r in inside for s in r.spans if s.lane == "compute"]
    cpu = [sum(s.end_ns - s.start_ns for s in r.spans if s.lane in CPU_WORK_LANES) for r in inside]
    gaps = idle_gaps(spans, lo, hi)
    edges = np.linspace(lo, hi, parts + 1)
    ends = np.array([r.end_ns for r in inside])
    counts = np.histogram(ends, bins=edges)[0] if ends.size else np.zeros(parts)
    sub = (counts / (length_s / parts)).tolist()
    return WindowStats(
        label=label,
        start_ns=int(lo),
        end_ns=int(hi),
        steps=len(inside),
        steps_per_s=len(inside) / length_s,
        tokens_per_s=sum(r.prefill_tokens + r.decode_tokens for r in inside) / length_s,
        step_ms=float(np.median(period)) / 1e6 if period.size else float("nan"),
        compute_ms=float(np.median(compute)) / 1e6 if compute else float("nan"),
        cpu_ms=float(np.median(cpu)) / 1e6 if cpu else float("nan"),
        busy=busy_fraction(spans, lo, hi),
        idle_ms=gaps.total_ns / 1e6,
        idle_gaps=gaps.count,
        largest_gap_ms=gaps.largest_ns / 1e6,
        idle_by_cause_ms={c: ns / 1e6 for c, ns in
                          idle_by_cause(recs, int(lo), int(hi)).by_cause.items()},
        sub_steps_per_s=sub,
    )
