"""The step waterfall: a window's wall time split into parts that add up to it.

Owns the split. For a window [lo, hi) of step records:

    floor                the byte floor (weights + KV read at the achievable bandwidth),
                         at most the window's kernel time
    kernels_above_floor  kernel time beyond that floor (fusion, better kernels pay here)
    in_step_gaps         inside steps, between kernels (launch bubbles: graphs pay here)
    idle_cpu             GPU idle waiting for the CPU's schedule/prepare/launch
    idle_launch          GPU idle while a graph launch reached its first kernel
    copies_sync          GPU idle for the H2D copy, or for the D2H copy and the CPU reading
                         the previous step (sync mode's serial tail)
    no_work              nothing queued

The idle parts are telemetry.gaps' causes (window - step busy); step busy (the union of
compute spans) is split into kernel time and gaps by the measured kernels of sampled steps
(telemetry.kernels): a sampled step by its own kernels, any other step by the kernel share
of sampled steps of the same key (graph bucket, or eager token count), else of all samples.
So the parts sum to the window by construction; without samples (a CPU, or none yet) the
kernel parts are None and `host_phases` gives the CPU's side instead.

Pure: no clocks, no torch, nothing of ours beyond telemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from telemetry.gaps import idle_by_cause
from telemetry.kernels import KernelSample, union_ns
from telemetry.metrics import busy_intervals, spans_of
from telemetry.records import CPU_LANES, StepRecord

COMPONENTS: tuple[str, ...] = ("floor", "kernels_above_floor", "in_step_gaps", "idle_cpu",
                               "idle_launch", "copies_sync", "no_work")
LABELS: dict[str, str] = {
    "floor": "byte floor",
    "kernels_above_floor": "kernels above floor",
    "in_step_gaps": "gaps between kernels",
    "idle_cpu": "idle: waiting for CPU",
    "idle_launch": "idle: graph launch",
    "copies_sync": "copies and sync",
    "no_work": "no work",
}
UNSPLIT = "compute_unsampled"  # the meter's step busy when no kernel sample splits it
CAUSE_PART = {"cpu": "idle_cpu", "graph_launch": "idle_launch", "h2d": "copies_sync",
               "previous_step": "copies_sync", "no_work": "no_work"}


def _key(r: StepRecord) -> object:
    return r.graph_bucket if r.graph_bucket is not None else ("eager", r.num_tokens)


@dataclass(slots=True)
class KernelShares:
    """Kernel share of step span: measured per sampled step, per step key, overall."""

    by_step: dict[int, float] = field(default_factory=dict)
    by_key: dict[object, float] = field(default_factory=dict)
    overall: float | None = None

    def of(self, r: StepRecord) -> float | None:
        s = self.by_step.get(r.step)
        if s is None:
            s = self.by_key.get(_key(r))
        return s if s is not None else self.overall


def kernel_shares(records: Iterable[StepRecord], samples: Iterable[KernelSample],
                  ) -> KernelShares:
    """Each sampled step's kernel time over its compute span (ours, so the share applies to
    our spans), pooled by step key and overall."""
    rec_by_step = {r.step: r for r in records}
    out = KernelShares()
    key_k: dict[object, list[int]] = {}
    tot_k = tot_s = 0
    for sample in samples:
        for st in sample.steps:
            work = st.work
            if not work:
                continue
            k = union_ns((x.start_ns, x.end_ns) for x in work)
            span = max(x.end_ns for x in work) - min(x.start_ns for x in work)
            r = rec_by_step.get(st.step)
            if r is not None:
                comp = [s for s in r.spans if s.lane == "compute"]
                if comp and comp[0].duration_ns > 0:
                    span = comp[0].duration_ns
                out.by_step[st.step] = min(1.0, k / span) if span else 0.0
                acc = key_k.setdefault(_key(r), [0, 0])
                acc[0] += k
                acc[1] += span
            tot_k += k
            tot_s += span
    out.by_key = {key: min(1.0, a / b) for key, (a, b) in key_k.items() if b}
    out.overall = min(1.0, tot_k / tot_s) if tot_s else None
    return out


@dataclass(slots=True)
class Waterfall:
    window_ns: int
    parts_ns: dict[str, int | None]  # COMPONENTS, None where unknown (no kernel samples)
    step_busy_ns: int
    kernel_ns: int | None

    @property
    def total_ns(self) -> int:
        return sum(v for v in self.parts_ns.values() if v is not None)

    def fractions(self) -> dict[str, float | None]:
        w = self.window_ns or 1
        return {k: (v / w if v is not None else None) for k, v in self.parts_ns.items()}


def waterfall(records: Sequence[StepRecord], lo: int, hi: int,
              samples: Iterable[KernelSample] = (),
              floor_ns: Callable[[StepRecord], float] | None = None) -> Waterfall:
    """Split [lo, hi) (host ns) into COMPONENTS. ``samples`` are kernel samples (default:
    those carried by ``records``); ``floor_ns(record)`` the step's byte floor in ns."""
    samples = list(samples) or [s for r in records for s in r.kernel_samples]
    starts, ends = busy_intervals(spans_of(records), lo, hi)
    busy = int((ends - starts).sum())
    idle = idle_by_cause(records, lo, hi)
    parts: dict[str, int | None] = dict.fromkeys(COMPONENTS, 0)
    for cause, ns in idle.by_cause.items():
        parts[CAUSE_PART[cause]] = (parts[CAUSE_PART[cause]] or 0) + ns
    shares = kernel_shares(records, samples)
    kernel = floor = 0.0
    known = shares.overall is not None
    for r in records:
        for s in r.spans:
            if s.lane != "compute" or s.end_ns <= s.start_ns:
                continue
            inside = min(s.end_ns, hi) - max(s.start_ns, lo)
            if inside <= 0:
                continue
            share = shares.of(r)
            if share is None:
                continue
            k = share * inside
            kernel += k
            if floor_ns is not None:
                floor += min(k, floor_ns(r) * inside / s.duration_ns)
    if not known:
        parts["floor"] = parts["kernels_above_floor"] = parts["in_step_gaps"] = None
        return Waterfall(hi - lo, parts, busy, None)
    kernel = min(kernel, float(busy))  # overlapping spans count once in busy
    parts["floor"] = round(floor)
    parts["kernels_above_floor"] = round(kernel) - round(floor)
    parts["in_step_gaps"] = busy - round(kernel)
    return Waterfall(hi - lo, parts, busy, round(kernel))


def step_floor_ns(weight_bytes: int, kv_bytes_per_token: int, contexts: Iterable[int],
                  bandwidth: float) -> float:
    """A step's byte floor: weights once plus each request's KV (its context) over
    ``bandwidth`` bytes/s, in ns."""
    total = weight_bytes + kv_bytes_per_token * sum(contexts)
    return total / bandwidth * 1e9


def host_phases(records: Sequence[StepRecord], lo: int, hi: int) -> dict[str, int]:
    """The CPU's side of a window: ns per host phase (cpu.* lanes, union per lane), and
    "other" for the rest (the loop between phases, or idle)."""
    out: dict[str, int] = {}
    spans = spans_of(records)
    for lane in CPU_LANES:
        s, e = busy_intervals(spans, lo, hi, lane)
        out[lane] = int((e - s).sum())
    out["other"] = max(0, (hi - lo) - sum(out.values()))
    return out


class WaterfallMeter:
    """Running totals of the waterfall for a stream of step records (a /metrics exporter
    feeds each batch it reads): each batch's stretch, from where the last one ended to its
    last compute end, is split with the latest kernel samples (the last ``keep``). Floors
    are not known to a reader of records alone: their time counts in kernels_above_floor
    (the floor part stays 0 unless ``floor_ns`` is given)."""

    def __init__(self, keep: int = 16,
                 floor_ns: Callable[[StepRecord], float] | None = None) -> None:
        self.keep = keep
        self.floor_ns = floor_ns
        self.samples: list[KernelSample] = []
        self.totals_ns: dict[str, int] = dict.fromkeys((*COMPONENTS, UNSPLIT), 0)
        self._end: int | None = None
        self._tail: list[StepRecord] = []

    def add(self, records: Sequence[StepRecord]) -> dict[str, int]:
        """Account a batch (step order); returns ns added per component."""
        for r in records:
            self.samples += r.kernel_samples
        self.samples = self.samples[-self.keep:]
        comp = [s for r in records for s in r.spans if s.lane == "compute"]
        if not comp:
            return {}
        hi = max(s.end_ns for s in comp)
        lo = self._end if self._end is not None else min(s.start_ns for s in comp)
        ctx = self._tail + list(records)
        self._tail = list(records[-2:])
        self._end = max(hi, lo)
        if hi <= lo:
            return {}
        wf = waterfall(ctx, lo, hi, self.samples, self.floor_ns)
        added: dict[str, int] = {}
        for k, v in wf.parts_ns.items():
            if v is None:  # no kernel samples: the busy time is not split
                continue
            added[k] = v
            self.totals_ns[k] += v
        if wf.kernel_ns is None:  # step busy that no sample could split (a CPU, or none yet)
            added[UNSPLIT] = wf.step_busy_ns
            self.totals_ns[UNSPLIT] += wf.step_busy_ns
        return added
