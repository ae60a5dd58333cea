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
(telemetry.kernels): a sampled step by its own kernels, any other step by the kernel *time*
per step of sampled steps of the same key (graph bucket, or eager token count) at its
context (`KernelTimes`), else of the same token count, else by the kernel share of all
samples. Kernel time per step, not a share of the span: a sampled graph step's span is
stretched by the profiler (its body starts up to a few hundred us after the marker) while
its kernels are not, so a share taken there and applied to an unsampled step would read
about half the kernel busy of unperturbed steps. The kernel parts over a window are so the
kernel busy of the window's own (unsampled, unperturbed) steps. The parts sum to the window
by construction; without samples (a CPU, or none yet) the kernel parts are None and
`host_phases` gives the CPU's side instead.

Pure: no clocks, no torch, nothing of ours beyond telemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from telemetry.gaps import idle_by_cause
from telemetry.kernels import KernelSample
from telemetry.metrics import busy_intervals, spans_of, union_length
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


def context_of(r: StepRecord) -> int:
    """A step's total context (tokens its attention reads: each chunk's end), 0 unknown."""
    return sum(int(c[2]) for c in r.chunks) if r.chunks else 0


@dataclass(slots=True)
class KernelTimes:
    """Measured kernel time per step (ns): each sampled step's own; for any other step, the
    sampled steps of its key (graph bucket, or eager token count) at the nearest contexts
    (interpolated between the two around it, the nearest one outside their range: a step's
    attention time grows with its context while its kernels stay the same); else the kernel
    share of all sampled steps' compute spans times its own span.

    A step whose key no sample has (the eager step that captures a batch's graphs, a step of
    a bucket not sampled yet) takes the sampled steps with its token count, graph or eager:
    they run the same kernels, within a percent of each other's time. The share of all
    samples' spans would not do for it: a capture step's span is mostly capture, not
    kernels."""

    by_step: dict[int, int] = field(default_factory=dict)
    by_key: dict[object, list[tuple[int, int]]] = field(default_factory=dict)  # (ctx, ns)
    by_tokens: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # (ctx, ns)
    overall_share: float | None = None

    def of(self, r: StepRecord, span_ns: int) -> float | None:
        k = self.by_step.get(r.step)
        if k is None:
            k = at_context(self.by_key.get(_key(r)), context_of(r))
        if k is None:
            k = at_context(self.by_tokens.get(r.num_tokens), context_of(r))
        if k is None:
            return None if self.overall_share is None else self.overall_share * span_ns
        return float(min(k, span_ns))  # a step's kernels lie inside its compute span


def at_context(points: list[tuple[int, int]] | None, ctx: int) -> float | None:
    """Kernel ns at context ``ctx`` from (context, ns) points: linear between the two around
    it, the nearest point's outside their range; None without points."""
    if not points:
        return None
    below = [p for p in points if p[0] <= ctx]
    above = [p for p in points if p[0] >= ctx]
    if not below or not above:
        c, k = min(points, key=lambda p: abs(p[0] - ctx))
        return float(k)
    (c0, k0), (c1, k1) = max(below), min(above)
    return float(k0 if c1 == c0 else k0 + (k1 - k0) * (ctx - c0) / (c1 - c0))


def kernel_times(records: Iterable[StepRecord], samples: Iterable[KernelSample],
                 ) -> KernelTimes:
    """Each sampled step's kernel time (union of its kernels, the graph marker left out),
    pooled by step key and context (several samples of one context: their mean)."""
    rec_by_step = {r.step: r for r in records}
    out = KernelTimes()
    pooled: dict[object, dict[int, list[int]]] = {}
    tokens: dict[int, dict[int, list[int]]] = {}
    tot_k = tot_s = 0
    for sample in samples:
        for st in sample.steps:
            work = st.work
            if not work:
                continue
            k = union_length((x.start_ns, x.end_ns) for x in work)
            span = max(x.end_ns for x in work) - min(x.start_ns for x in work)
            r = rec_by_step.get(st.step)
            if r is not None:
                out.by_step[st.step] = k
                comp = [s for s in r.spans if s.lane == "compute"]
                if comp and comp[0].duration_ns > 0:
                    span = comp[0].duration_ns
                pooled.setdefault(_key(r), {}).setdefault(context_of(r), []).append(k)
                tokens.setdefault(r.num_tokens, {}).setdefault(context_of(r), []).append(k)
            tot_k += k
            tot_s += span
    out.by_key = {key: sorted((c, round(sum(v) / len(v))) for c, v in by_ctx.items())
                  for key, by_ctx in pooled.items()}
    out.by_tokens = {n: sorted((c, round(sum(v) / len(v))) for c, v in by_ctx.items())
                     for n, by_ctx in tokens.items()}
    out.overall_share = min(1.0, tot_k / tot_s) if tot_s else None
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
              floor_ns: Callable[[StepRecord], float] | None = None,
              sampled_records: Iterable[StepRecord] = ()) -> Waterfall:
    """Split [lo, hi) (host ns) into COMPONENTS. ``samples`` are kernel samples (default:
    those carried by ``records``); ``floor_ns(record)`` the step's byte floor in ns (default:
    the record's own ``floor_ns``, 0 where the engine did not know it);
    ``sampled_records``: more records (the sampled steps' own, where ``records`` lacks them)
    that give sampled steps their key and context."""
    samples = list(samples) or [s for r in records for s in r.kernel_samples]
    starts, ends = busy_intervals(spans_of(records), lo, hi)
    busy = int((ends - starts).sum())
    idle = idle_by_cause(records, lo, hi)
    parts: dict[str, int | None] = dict.fromkeys(COMPONENTS, 0)
    for cause, ns in idle.by_cause.items():
        parts[CAUSE_PART[cause]] = (parts[CAUSE_PART[cause]] or 0) + ns
    times = kernel_times([*sampled_records, *records], samples)
    kernel = floor = 0.0
    known = times.overall_share is not None
    for r in records:
        for s in r.spans:
            if s.lane != "compute" or s.end_ns <= s.start_ns:
                continue
            inside = min(s.end_ns, hi) - max(s.start_ns, lo)
            if inside <= 0:
                continue
            k_step = times.of(r, s.duration_ns)
            if k_step is None:
                continue
            k = k_step * inside / s.duration_ns
            kernel += k
            f = floor_ns(r) if floor_ns is not None else r.floor_ns
            if f:
                floor += min(k, f * inside / s.duration_ns)
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
    last compute end, is split with the latest kernel samples (the last ``keep``). The floor
    part is the records' own ``floor_ns`` (set by an engine on a GPU), or ``floor_ns``'s."""

    def __init__(self, keep: int = 16,
                 floor_ns: Callable[[StepRecord], float] | None = None) -> None:
        self.keep = keep
        self.floor_ns = floor_ns
        self.samples: list[KernelSample] = []
        self.totals_ns: dict[str, int] = dict.fromkeys((*COMPONENTS, UNSPLIT), 0)
        self._end: int | None = None
        self._tail: list[StepRecord] = []
        # the records of sampled steps (a sample rides on a later record than its steps):
        # they give the samples' key and context (KernelTimes)
        self._sampled: dict[int, StepRecord] = {}
        self._recent: dict[int, StepRecord] = {}

    def add(self, records: Sequence[StepRecord]) -> dict[str, int]:
        """Account a batch (step order); returns ns added per component."""
        for r in records:
            self._recent[r.step] = r
            self.samples += r.kernel_samples
        self.samples = self.samples[-self.keep:]
        wanted = {st.step for k in self.samples for st in k.steps}
        self._sampled = {n: r for n, r in {**self._sampled, **self._recent}.items()
                         if n in wanted}
        self._recent = {n: self._recent[n] for n in sorted(self._recent)[-256:]}
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
        wf = waterfall(ctx, lo, hi, self.samples, self.floor_ns,
                       sampled_records=list(self._sampled.values()))
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
