"""Reading a finished kernel-sampler trace: the profiler's events (Kineto's JSON export or the
result's own event objects, as Chrome-trace dicts) grouped by sampled step on our clock, as a
`telemetry.kernels.KernelSample`. Pure functions of the events and the sampler's bracket
marks (engine/instruments/kernel_trace.py says how steps are bracketed), so they are tested on a CPU
from synthetic traces. It never starts or stops a profiler.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
from typing import Any

from engine.instruments.kernel_trace_clock import ClockLost, clock_lost
from telemetry.anatomy import STEP_MARKER, group_by_step
from telemetry.kernel_family import MARKER_PATTERN, family_of
from telemetry.kernels import KernelRecord, KernelSample, SampledStep, make_sample


class NoRuntimeEvents(RuntimeError):
    """The trace has no CUDA runtime events to find the sampled steps by."""


def trace_events(result: Any) -> list[dict[str, Any]]:
    """The Chrome-trace events of a finished profiler result (written to a temporary file
    by Kineto, read back, removed)."""
    fd, path = tempfile.mkstemp(prefix="gapless-kernels-", suffix=".json")
    os.close(fd)
    try:
        result.save(path)
        with open(path) as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


_RUNTIME = ("cuda_runtime", "cuda_driver")
_DEVICE = ("kernel", "gpu_memset", "gpu_memcpy")
_HOST_COPY = re.compile(r"Memcpy (HtoD|DtoH)|Memcpy .*Pinned|Memcpy .*Pageable")


def _corr(ev: dict[str, Any]) -> Any:
    args = ev.get("args") or {}
    return args.get("correlation", args.get("correlation id"))


def _ns(ev: dict[str, Any], at: float = 0.0) -> float:
    return (float(ev["ts"]) + at * float(ev.get("dur", 0))) * 1000.0


MARK_KERNEL = "spin_kernel"  # torch.cuda._sleep(0): our bracket launches, on a side stream
# Runtime calls that launch kernels: each must have device records, else some were lost.
_LAUNCH = re.compile(r"LaunchKernel|LaunchCooperativeKernel|GraphLaunch")
_GRAPH_LAUNCH = re.compile(r"GraphLaunch")


class LostKernels(ValueError):
    """The trace kept runtime calls but no kernel record of a sampled step: the profiler
    dropped them (Kineto/CUPTI lose the kernel records at the start of a session, more of
    them the more sessions the process has run: pytorch/pytorch#192021)."""


def lost_launches(events: list[dict[str, Any]], until_us: float | None = None) -> int:
    """Kernel-launch calls (up to ``until_us`` on the trace clock) with no device record:
    kernels the profiler ran but did not keep."""
    have = {_corr(e) for e in events if e.get("ph") == "X" and e.get("cat") in _DEVICE}
    return sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in _RUNTIME
               and _LAUNCH.search(str(e.get("name", ""))) and _corr(e) not in have
               and (until_us is None or float(e["ts"]) <= until_us))


def by_markers(events: list[dict[str, Any]], marks: dict[int, tuple[int, int, int, int]],
               ) -> tuple[dict[int, list[dict[str, Any]]], float]:
    """Device events per sampled step, found by the bracket launches (a zero-cycle spin
    kernel on a side stream, two per step, in step order), and the trace-to-host offset
    (ns). The bracket launches are found through their kernels' correlation ids, so no
    clock matching is needed to find them; launches made between a step's two brackets on
    the same thread belong to it. Raises NoRuntimeEvents without runtime events."""
    runtime = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in _RUNTIME),
                     key=lambda e: float(e["ts"]))
    if not runtime:
        raise NoRuntimeEvents("kernel sampler: the trace has no CUDA runtime events")
    mark_corr = {_corr(e) for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"
                 and MARK_KERNEL in str(e.get("name", ""))}
    calls = [e for e in runtime if _corr(e) in mark_corr]
    steps = sorted(marks)
    ours = sorted([((a + b) / 2, n, 0) for n in steps for a, b in [marks[n][:2]]]
                  + [((c + d) / 2, n, 1) for n in steps for c, d in [marks[n][2:]]])
    if not calls or len(calls) > len(ours):
        kernels = sum(1 for e in events if e.get("cat") == "kernel")
        kind = LostKernels if not calls else ValueError
        raise kind(f"kernel sampler: {len(calls)} bracket launches in the trace for "
                   f"{len(ours)} brackets ({len(runtime)} runtime events, {kernels} kernels, "
                   f"{lost_launches(events)} kernel launches without a record"
                   + ("; the profiler dropped the kernel records: pytorch/pytorch#192021)"
                      if not calls else ")"))
    # Launches made just after the profiler started may be missing: match from the end.
    matched = list(zip(ours[len(ours) - len(calls):], calls, strict=True))
    offsets = [_ns(call, 0.5) - t for (t, _, _), call in matched]
    found = {(n, k): call for (_, n, k), call in matched}
    step_of: dict[Any, int] = {}
    launches: dict[int, list[dict[str, Any]]] = {}  # step -> its kernel-launch calls
    for n in steps:
        lo_ev, hi_ev = found.get((n, 0)), found.get((n, 1))
        if lo_ev is None or hi_ev is None:
            continue
        lo, hi, tid = _ns(lo_ev), _ns(hi_ev, 1.0), lo_ev.get("tid")
        for e in runtime:
            t = _ns(e)
            if lo < t < hi and e.get("tid") == tid and _corr(e) not in mark_corr | {None}:
                step_of[_corr(e)] = n
                if _LAUNCH.search(str(e.get("name", ""))):
                    launches.setdefault(n, []).append(e)
    out: dict[int, list[dict[str, Any]]] = {n: [] for n in steps}
    by_corr: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in _DEVICE:
            by_corr.setdefault(_corr(e), []).append(e)
            n = step_of.get(_corr(e))
            if n is not None and not _HOST_COPY.search(str(e.get("name", ""))):
                out[n].append(e)
    # A step some of whose kernels the profiler dropped would read as less work than it
    # did: it becomes a step without kernels (the grouping then counts only later steps).
    # Dropped records are the first ones of a session, so a step that lost any lost its
    # first launch's: an eager kernel, or a graph's first kernel, which is our start marker
    # (where graphs carry markers). Only the first launch is judged: a later one without a
    # record is not this loss.
    markers = any(MARKER_PATTERN.search(str(e.get("name", ""))) for e in events
                  if e.get("cat") == "kernel")
    for n, calls_n in launches.items():
        call = min(calls_n, key=lambda e: float(e["ts"]))
        got = by_corr.get(_corr(call), [])
        if not got or (markers and _GRAPH_LAUNCH.search(str(call.get("name", "")))
                       and not any(MARKER_PATTERN.search(str(k.get("name", "")))
                                   for k in got)):
            out[n] = []
    return out, statistics.median(offsets)


def by_ranges(events: list[dict[str, Any]], marks: dict[int, tuple[int, int, int, int]],
              ) -> tuple[dict[int, list[dict[str, Any]]], float]:
    """The fallback: device events per step by the ``gapless.step <n>`` ranges."""
    offsets = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(STEP_MARKER) and e.get("cat") != (
                "gpu_user_annotation"):
            n = int(name[len(STEP_MARKER):])
            if n in marks:
                a, _, _, d = marks[n]
                offsets.append(_ns(e, 0.5) - (a + d) / 2)
    if not offsets:
        raise ValueError("kernel sampler: no step ranges in the trace")
    out: dict[int, list[dict[str, Any]]] = {}
    for s in group_by_step(events, device_cats=_DEVICE, keep_marker=True):
        out[s.step] = [{"name": k.name, "ts": k.start_us, "dur": k.dur_us} for k in s.kernels]
    return out, statistics.median(offsets)


def to_sample(events: list[dict[str, Any]], first: int, steps: int,
              marks: dict[int, tuple[int, int, int, int]], cost_ns: int = 0,
              spans: dict[int, tuple[int, int, int, int]] | None = None,
              ) -> KernelSample | None:
    """A trace's kernels grouped by sampled step on our clock; steps first..first+steps-1
    are counted, the next one ends the window. Raises kernel_trace_clock.ClockLost for a
    trace whose CUDA events lost their times."""
    lost_clock = clock_lost(events)
    if lost_clock is not None:
        raise ClockLost(f"kernel sampler: {lost_clock}")
    has_ranges = any(str(e.get("name", "")).startswith(STEP_MARKER) for e in events)
    per_step, off = (by_ranges if has_ranges else by_markers)(events, marks)
    sampled: list[SampledStep] = []
    next_start: int | None = None
    for n in range(first, first + steps + 1):
        evs = per_step.get(n)
        if not evs:
            # A counted step without kernels (its brackets or kernels lost): the window
            # must hold only whole steps, so it restarts after it.
            sampled = []
            continue
        ks = sorted((KernelRecord(str(e["name"]), family_of(str(e["name"])),
                                  round(_ns(e) - off), round(_ns(e, 1.0) - off))
                     for e in evs), key=lambda k: k.start_ns)
        if n == first + steps:
            next_start = ks[0].start_ns
        else:
            sampled.append(SampledStep(n, ks))
    # The sampler's own launches (brackets) around the counted steps and the one that ends
    # the window: on a CPU-bound step they delay the GPU (the fallback has none).
    # (``spans``: each bracket's whole time, stream switches included; else the launches)
    whole = spans if spans is not None else marks
    brackets = [] if has_ranges else [
        iv for n in range(first, first + steps + 1) if n in whole
        for iv in ((whole[n][0], whole[n][1]), (whole[n][2], whole[n][3]))]
    lost = 0 if has_ranges else lost_launches(events, max(_bracket_calls_end(events)))
    sample = make_sample(sampled, next_start, "ranges" if has_ranges else "brackets", cost_ns,
                         brackets)
    if sample is None and lost:
        raise LostKernels(f"kernel sampler: no whole step among {steps + 1} sampled steps; "
                          f"{lost} kernel launches have no record in the trace (the profiler "
                          "dropped them: pytorch/pytorch#192021)")
    if sample is not None:
        sample.skipped_steps = steps - len(sample.steps)
        sample.lost_launches = lost
    return sample


def _bracket_calls_end(events: list[dict[str, Any]]) -> list[float]:
    """Trace times (us) of the bracket launch calls' ends: launches after the last one may
    still have been running when the profiler stopped, so they are not counted as lost."""
    mark_corr = {_corr(e) for e in events if e.get("cat") == "kernel"
                 and MARK_KERNEL in str(e.get("name", ""))}
    ends = [float(e["ts"]) + float(e.get("dur", 0)) for e in events
            if e.get("cat") in _RUNTIME and _corr(e) in mark_corr]
    return ends or [float("inf")]


def object_events(result: Any) -> list[dict[str, Any]]:
    """The same events read from the profiler result's objects, without Kineto's JSON
    export (which writes, parses and holds the GIL for the whole trace): only the fields the
    grouping reads. Times are the profiler's (ns), as in the export; `read_events` checks
    the two against each other once per process before trusting this path."""
    from torch._C._autograd import DeviceType

    out = []
    cuda = DeviceType.CUDA
    for e in result.events():
        name = e.name()
        tid = 0
        if e.device_type() == cuda:
            if name.startswith(STEP_MARKER):
                continue  # a user annotation on the device timeline, not work
            cat = ("gpu_memcpy" if name.startswith("Memcpy") else
                   "gpu_memset" if name.startswith("Memset") else "kernel")
        else:
            # (start_thread_id and duration_ns are the slow getters: only what is read)
            cat, tid = ("cuda_runtime" if name.startswith("cu") else "cpu_op"), \
                e.start_thread_id()
        start = e.start_ns()
        out.append({"ph": "X", "cat": cat, "name": name, "ts": start / 1000.0,
                    "dur": (e.end_ns() - start) / 1000.0, "tid": tid,
                    "args": {"correlation": e.correlation_id()}})
    return out


def _same(a: KernelSample | None, b: KernelSample | None) -> bool:
    """Same steps, kernels and times within 2 us (the export rounds to microseconds)."""
    if a is None or b is None:
        return a is b
    if [(st.step, len(st.kernels)) for st in a.steps] != [
            (st.step, len(st.kernels)) for st in b.steps]:
        return False
    return all(ka.name == kb.name and abs(ka.start_ns - kb.start_ns) <= 2000
               and abs(ka.end_ns - kb.end_ns) <= 2000
               for sa, sb in zip(a.steps, b.steps, strict=True)
               for ka, kb in zip(sa.kernels, sb.kernels, strict=True))
