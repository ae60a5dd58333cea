"""Step anatomy: a kernel recording grouped by step, then by kernel family, against the floor.

Owns the pure part of the anatomy: from profiler events (the dicts of a Chrome trace that
torch.profiler/Kineto writes) it finds each step's kernels, times the step (first kernel to
last), its time inside kernels (union) and the gaps between them, gives each kernel its
family (telemetry.kernel_family, the classifier every view shares) and builds the
family table (count, time, share) and the step's byte floor figures. It also calibrates the
in-step kernel gaps per graph bucket, so a live window's *kernel busy* can be estimated from
its *step busy* (see kernel_busy_estimate).

How kernels find their step: the engine wraps each step's launches in a profiler range named
``gapless.step <n>`` (user_annotation); a kernel's ``correlation`` id names the runtime call
that launched it (a cudaGraphLaunch launches all of a graph's kernels under one id), and the
step is the range that holds that call. Events without a correlation (CPU ops, for tests on
a CPU) belong to the range that holds them in time.

A step is *measured* when the profiler kept a device record of every launch in it. A step
without kernel records, or with a launch call whose kernels have no record (the profiler
dropped them), is not: its gaps would read as idle GPU time that nobody measured, so the
summary lists it under ``not_measured`` with the reason, apart from the measured steps.

It must never import torch or anything of ours, read clocks or touch a profiler: the engine
records (engine/instruments/anatomy.py), this module only reads what was recorded.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from telemetry.kernel_family import FAMILIES, MARKER_PATTERN, family_of
from telemetry.metrics import busy_intervals, spans_of, union_length
from telemetry.records import StepRecord

STEP_MARKER = "gapless.step "
DEVICE_CATS: tuple[str, ...] = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS: tuple[str, ...] = ("cuda_runtime", "cuda_driver")
# Runtime calls that launch kernels: each must have device records, else some were lost.
LAUNCH_CALL = re.compile(r"LaunchKernel|LaunchCooperativeKernel|GraphLaunch")


@dataclass(slots=True, frozen=True)
class Kernel:
    name: str
    family: str
    start_us: float
    dur_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


@dataclass(slots=True)
class StepKernels:
    """One step's device work as the profiler saw it. Times in microseconds."""

    step: int
    kernels: list[Kernel] = field(default_factory=list)
    # Launch calls in the step whose kernels the profiler kept no record of
    lost_launches: int = 0

    @property
    def measured(self) -> bool:
        """Every launch of the step has its kernels recorded: its gaps are measured."""
        return bool(self.kernels) and not self.lost_launches

    @property
    def not_measured_why(self) -> str | None:
        if not self.kernels:
            return "no kernel record (the profiler kept none of this step's kernels)"
        if self.lost_launches:
            return (f"{self.lost_launches} launch{'es' if self.lost_launches > 1 else ''} "
                    "without a kernel record (the profiler dropped them)")
        return None

    @property
    def span_us(self) -> float:
        """First kernel start to last kernel end: what the engine's compute span measures."""
        if not self.kernels:
            return 0.0
        return max(k.end_us for k in self.kernels) - min(k.start_us for k in self.kernels)

    @property
    def kernel_us(self) -> float:
        """Time inside kernels (union: overlapping kernels count once)."""
        return union_length((k.start_us, k.end_us) for k in self.kernels)

    @property
    def gap_us(self) -> float:
        return self.span_us - self.kernel_us


_HOST_COPY = re.compile(r"Memcpy (HtoD|DtoH)|Memcpy .*Pinned|Memcpy .*Pageable")


def _corr(ev: Mapping[str, Any]) -> Any:
    args = ev.get("args") or {}
    return args.get("correlation", args.get("correlation id"))


def group_by_step(events: Sequence[Mapping[str, Any]],
                  device_cats: tuple[str, ...] = DEVICE_CATS,
                  keep_marker: bool = False) -> list[StepKernels]:
    """Each marked step's device events (``cat`` in ``device_cats``), in step order.

    A CUDA graph's start-marker kernel (telemetry.kernel_family.MARKER_PATTERN: ours, before the
    step's compute span) is left out unless ``keep_marker``.

    Steps are the ``gapless.step <n>`` ranges; a device event with a correlation id joins
    the step whose range holds the runtime call with that id; one without joins the range
    that holds its own start on the same thread. Events of no step are left out. A launch
    call of a step whose correlation no device event carries counts in its
    ``lost_launches``.
    """
    markers = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
         int(str(e["name"])[len(STEP_MARKER):]), e.get("tid"))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith(STEP_MARKER)
        and e.get("cat") != "gpu_user_annotation"
    )

    def step_at(ev: Mapping[str, Any], same_thread: bool = True) -> int | None:
        ts, tid = float(ev["ts"]), ev.get("tid")
        for a, b, n, marker_tid in markers:
            if a <= ts <= b and (not same_thread or tid == marker_tid):
                return n
        return None

    launch_step: dict[Any, int] = {}
    launches: list[tuple[Any, int]] = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS:
            corr = _corr(e)
            # Only the engine's loop thread launches device work: no thread check needed.
            n = step_at(e, same_thread=False) if corr is not None else None
            if n is not None:
                launch_step[corr] = n
                if LAUNCH_CALL.search(str(e.get("name", ""))):
                    launches.append((corr, n))
    steps: dict[int, StepKernels] = {n: StepKernels(n) for _, _, n, _ in markers}
    recorded = {_corr(e) for e in events
                if e.get("ph") == "X" and e.get("cat") in (*DEVICE_CATS, *device_cats)}
    for corr, n in launches:
        if corr not in recorded:
            steps[n].lost_launches += 1
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in device_cats:
            continue
        name = str(e.get("name", ""))
        if not keep_marker and MARKER_PATTERN.search(name):
            continue
        if _HOST_COPY.search(name):
            # The step's H2D/D2H copies run on their own streams, overlapping the previous
            # and next steps' kernels in async mode: a step's span is its compute work.
            continue
        corr = _corr(e)
        n = launch_step.get(corr) if corr is not None else step_at(e)
        if n is None:
            continue
        steps[n].kernels.append(Kernel(name, family_of(name), float(e["ts"]),
                                       float(e.get("dur", 0))))
    return [steps[n] for n in sorted(steps)]


@dataclass(slots=True, frozen=True)
class FamilyRow:
    family: str
    count: float  # kernels per step
    time_us: float  # per step, sum of durations
    share: float  # of the step's summed kernel time


def family_table(steps: Sequence[StepKernels]) -> list[FamilyRow]:
    """Per-step means by family, biggest time first; families with no kernel are left out."""
    steps = [s for s in steps if s.kernels]
    if not steps:
        return []
    count: dict[str, int] = {}
    time: dict[str, float] = {}
    for s in steps:
        for k in s.kernels:
            count[k.family] = count.get(k.family, 0) + 1
            time[k.family] = time.get(k.family, 0.0) + k.dur_us
    total = sum(time.values()) or 1.0
    n = len(steps)
    rows = [FamilyRow(f, count[f] / n, time[f] / n, time[f] / total) for f in count]
    return sorted(rows, key=lambda r: -r.time_us)


@dataclass(slots=True, frozen=True)
class FloorFigures:
    """A step against its byte floor: floor_bytes (weights + KV read) at ``peak_bw``."""

    floor_bytes: int
    span_us: float
    floor_us: float
    achieved_bw: float  # floor bytes / step span, bytes/s

    @property
    def times_floor(self) -> float:
        return self.span_us / self.floor_us if self.floor_us else 0.0


def floor_figures(step: StepKernels, floor_bytes: int, peak_bw: float) -> FloorFigures:
    """How near one step ran to its byte floor. Raises ValueError on a non-positive peak."""
    if not peak_bw > 0:
        raise ValueError(f"peak_bw must be > 0 bytes/s, got {peak_bw!r}")
    span = step.span_us
    achieved = floor_bytes / (span * 1e-6) if span else 0.0
    return FloorFigures(floor_bytes, span, floor_bytes / peak_bw * 1e6, achieved)


def kernel_busy(events: Sequence[Mapping[str, Any]], window_us: tuple[float, float] | None = None,
                device_cats: tuple[str, ...] = ("kernel",)) -> float:
    """Union of kernel time / window (default: first kernel start to last kernel end)."""
    iv = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
          if e.get("ph") == "X" and e.get("cat") in device_cats]
    if not iv:
        return 0.0
    lo, hi = window_us if window_us is not None else (min(a for a, _ in iv),
                                                      max(b for _, b in iv))
    if hi <= lo:
        return 0.0
    clipped = [(max(a, lo), min(b, hi)) for a, b in iv if b > lo and a < hi]
    return union_length(clipped) / (hi - lo)


StepKey = Hashable  # what a step's in-step gaps depend on: see step_key


def step_key(graph_bucket: int | None, num_tokens: int) -> StepKey:
    """A CUDA-graph step's gaps are the graph's (its bucket); an eager step's depend on how
    many tokens it ran (decode steps of one batch size share them)."""
    return graph_bucket if graph_bucket is not None else ("eager", num_tokens)


@dataclass(slots=True, frozen=True)
class GapCalibration:
    """In-step gaps measured by a kernel recording: mean ns per step key, and the overall
    gap share of step time for keys the recording did not see."""

    gap_ns: dict[StepKey, float]
    gap_fraction: float
    steps: int


def gap_calibration(steps: Sequence[StepKernels],
                    key_of: Mapping[int, StepKey]) -> GapCalibration:
    """Mean in-step gap (span - kernel time) per step key from a recording; ``key_of`` maps
    step number -> step_key(...) of that step. Steps not measured or without a key are
    skipped."""
    acc: dict[StepKey, list[float]] = {}
    gap_total = span_total = 0.0
    used = 0
    for s in steps:
        if s.measured and s.step in key_of:
            acc.setdefault(key_of[s.step], []).append(s.gap_us * 1000.0)
            gap_total += s.gap_us
            span_total += s.span_us
            used += 1
    return GapCalibration({k: sum(v) / len(v) for k, v in acc.items()},
                          gap_total / span_total if span_total else 0.0, used)


def kernel_busy_estimate(step_busy_ns: float, steps: Iterable[tuple[StepKey, int]],
                         window_ns: int, cal: GapCalibration) -> float:
    """Kernel busy of a window estimated from its step busy: the window's compute-span time
    ``step_busy_ns`` minus each step's calibrated in-step gap (``steps``: (step key,
    compute span ns) per step in the window); a key the calibration never saw takes the
    calibration's overall gap share of its span."""
    if window_ns <= 0:
        return 0.0
    gaps = 0.0
    for key, span_ns in steps:
        gap = cal.gap_ns.get(key)
        gaps += min(gap, span_ns) if gap is not None else cal.gap_fraction * span_ns
    return max(0.0, step_busy_ns - gaps) / window_ns


def kernel_busy_of_window(records: Iterable[StepRecord], window_start_ns: int,
                         window_end_ns: int, cal: GapCalibration) -> float:
    """kernel_busy_estimate over a window of step records: step busy (union of compute
    spans, telemetry.metrics) less each step's calibrated in-step gap, prorated for a step
    that lies partly outside the window."""
    records = list(records)
    starts, ends = busy_intervals(spans_of(records), window_start_ns, window_end_ns)
    window = window_end_ns - window_start_ns
    if window <= 0:
        return 0.0
    gaps = 0.0
    for r in records:
        for s in r.spans:
            if s.lane != "compute" or s.end_ns <= s.start_ns:
                continue
            inside = min(s.end_ns, window_end_ns) - max(s.start_ns, window_start_ns)
            if inside <= 0:
                continue
            full = s.end_ns - s.start_ns
            gap = cal.gap_ns.get(step_key(r.graph_bucket, r.num_tokens))
            gap = min(gap, full) if gap is not None else cal.gap_fraction * full
            gaps += gap * inside / full
    return max(0.0, float((ends - starts).sum()) - gaps) / window


def anatomy_chrome_trace(steps: Sequence[StepKernels]) -> dict[str, Any]:
    """A compact Chrome trace of recorded steps: one row per kernel family, one row for the
    steps themselves (first kernel to last), times in microseconds as recorded."""
    rows = {f: i + 2 for i, f in enumerate(FAMILIES)}
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "step"}}]
    out += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": f}}
            for f, tid in rows.items()]
    for s in steps:
        if not s.kernels:
            continue
        first = min(k.start_us for k in s.kernels)
        out.append({"ph": "X", "name": f"step {s.step}", "pid": 1, "tid": 1, "ts": first,
                    "dur": s.span_us, "args": {"kernels": len(s.kernels),
                                               "kernel_us": round(s.kernel_us, 3),
                                               "gap_us": round(s.gap_us, 3)}})
        out += [{"ph": "X", "name": k.name, "pid": 1, "tid": rows[k.family], "ts": k.start_us,
                 "dur": k.dur_us, "args": {"step": s.step}} for k in s.kernels]
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def summary_dict(steps: Sequence[StepKernels], *, device: str, first_step: int,
                 trace_path: str | None = None, floor_bytes: int | None = None,
                 peak_bw: float | None = None,
                 calibration: GapCalibration | None = None) -> dict[str, Any]:
    """A recording as plain data (picklable) for a client or a page: per-step timing, the
    family table, the compact per-family Chrome trace (all of measured steps only), the
    recorded steps that were not measured with the reason (``not_measured``), the full
    trace's path, with ``floor_bytes``/``peak_bw`` each step against its byte floor, and the
    gap calibration (``calibration``: a GapCalibration, for kernel_busy_estimate) when given."""
    unmeasured = [{"step": s.step, "why": s.not_measured_why} for s in steps if not s.measured]
    steps = [s for s in steps if s.measured]
    out: dict[str, Any] = {
        "device": device,
        "first_step": first_step,
        "trace_path": trace_path,
        "steps": [{"step": s.step, "kernels": len(s.kernels), "span_us": s.span_us,
                   "kernel_us": s.kernel_us, "gap_us": s.gap_us} for s in steps],
        "families": [{"family": r.family, "count": r.count, "time_us": r.time_us,
                      "share": r.share} for r in family_table(steps)],
        "trace": anatomy_chrome_trace(steps),
        "calibration": calibration,
        "not_measured": unmeasured,
    }
    if floor_bytes is not None and peak_bw is not None:
        for row, s in zip(out["steps"], steps, strict=True):
            f = floor_figures(s, floor_bytes, peak_bw)
            row.update(floor_us=f.floor_us, achieved_bw=f.achieved_bw,
                       times_floor=f.times_floor)
    return out
