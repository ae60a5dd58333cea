"""The kernel sampler: the measured kernels of a few consecutive steps, every period, always on.

Owns `KernelSampler` (a loop-thread half and a worker thread) and the reading of its traces
into a `telemetry.kernels.KernelSample`: steps told apart by bracket kernels around each
sampled launch (`KernelSampler.marked`), put on the host clock by the brackets' own times. A
sample rides on the record of the step that closed its window (observer.SamplePublisher).

It never starts while another profiler runs (the observer gives the step anatomy its turn;
profiler_sessions' rules hold), never starts or stops a session off the loop thread, never
blocks the loop on a conversion, and never leaves the profiler on after an error.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from engine.instruments import profiler_sessions as sessions
from telemetry.anatomy import LAUNCH_CALL, STEP_MARKER, group_by_step
from telemetry.kernel_family import MARKER_PATTERN, family_of
from telemetry.kernels import KernelRecord, KernelSample, SampledStep, make_sample

log = logging.getLogger("gapless.kernels")

DEFAULT_PERIOD_S = 10.0
DEFAULT_STEPS = 4
MAX_READY = 64
# The worker converts with a 0.5 ms GIL switch interval (Python's default is 5 ms): the loop
# thread, which needs the GIL back after each blocking CUDA call, then waits at most that
# long for it while a conversion runs, instead of up to a step's worth of time.
CONVERT_SWITCH_S: float | None = 0.0005
# Recorded but not counted: the first step after the profiler starts pays CUPTI's start-up
# on its launches (a gap a CPU-bound step would show as idle GPU). More are run when a sample
# finds the profiler dropped kernels of its counted steps (see `KernelSampler._convert`).
WARMUP_STEPS = 1
MAX_WARMUP_STEPS = 32


# ------------------------------------------------------------------ reading a trace
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
HOST_COPY = re.compile(r"Memcpy (HtoD|DtoH)|Memcpy .*Pinned|Memcpy .*Pageable")


def _corr(ev: dict[str, Any]) -> Any:
    args = ev.get("args") or {}
    return args.get("correlation", args.get("correlation id"))


def _ns(ev: dict[str, Any], at: float = 0.0) -> float:
    return (float(ev["ts"]) + at * float(ev.get("dur", 0))) * 1000.0


MARK_KERNEL = "spin_kernel"  # torch.cuda._sleep(0): our bracket launches, on a side stream
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
               and LAUNCH_CALL.search(str(e.get("name", ""))) and _corr(e) not in have
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
                if LAUNCH_CALL.search(str(e.get("name", ""))):
                    launches.setdefault(n, []).append(e)
    out: dict[int, list[dict[str, Any]]] = {n: [] for n in steps}
    by_corr: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in _DEVICE:
            by_corr.setdefault(_corr(e), []).append(e)
            n = step_of.get(_corr(e))
            if n is not None and not HOST_COPY.search(str(e.get("name", ""))):
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
    are counted, the next one ends the window. Raises profiler_sessions.ClockLost for a
    trace whose CUDA events lost their times."""
    lost_clock = sessions.clock_lost(events)
    if lost_clock is not None:
        raise sessions.ClockLost(f"kernel sampler: {lost_clock}")
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
    grouping reads. Times are the profiler's (ns), as in the export; `convert` checks
    the two against each other (the "compare" reader) before trusting this path."""
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


# --------------------------------------------------------------------------- sampler
class KernelSampler:
    """The loop-thread half (``begin_step`` / ``step_done``) and its worker thread: every
    ``period_s`` the next warm-up + ``steps`` + 1 steps run under a CUDA-only Kineto session;
    the worker converts the finished trace while the loop goes on."""

    def __init__(self, *, enabled: bool, period_s: float = DEFAULT_PERIOD_S,
                 steps: int = DEFAULT_STEPS) -> None:
        self.set_period(period_s)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"kernel sample steps must be an int >= 1, got {steps!r}")
        if enabled and torch.cuda.is_available():
            try:
                sessions.prime_profiler()  # on the thread that builds the engine
            except Exception as e:  # a profiler that cannot start: the sampler will say so
                log.warning("kernel sampler: priming the profiler failed: %s", e)
        self.steps = steps
        self.enabled = enabled
        self.next_at = time.perf_counter() + min(self.period_s, 0.5)
        self.open = False  # a profiler session of ours is on
        self.first = 0
        # step -> perf ns (before, after) its opening and closing bracket calls
        self.marks: dict[int, tuple[int, int, int, int]] = {}
        self.spans: dict[int, tuple[int, int, int, int]] = {}  # the brackets' whole time
        self.with_cpu = False  # fallback: CPU activities and step ranges
        self.warmup = WARMUP_STEPS  # steps recorded before the counted ones, not counted
        self._side: Any = None  # the side stream of the bracket kernels
        self.cost_ns = 0
        self.ready: deque[KernelSample] = deque(maxlen=MAX_READY)  # for the next record
        self.samples_made = 0
        self.lost_samples = 0  # samples whose every counted step lost kernels
        self.lost_in_row = 0  # such samples since the last good one (the Live page says so)
        self.open_warmup = WARMUP_STEPS
        self.failures = 0
        self.clock_lost = 0  # traces whose CUDA times were lost (profiler_sessions)
        self.last_error: str | None = None
        self._jobs: queue.SimpleQueue[tuple[tuple, int] | None] | None = None
        self._worker: threading.Thread | None = None
        # samples handed to the worker / done by it (each counter written by one thread)
        self._submitted = self._converted = 0
        self.convert_s: deque[float] = deque(maxlen=64)  # worker seconds per conversion
        # False only to measure the sampler's cost without its conversion (bench watch-cost)
        self.keep_results = True

    def set_period(self, period_s: float) -> None:
        if isinstance(period_s, bool) or not isinstance(period_s, (int, float)) or not (
                period_s == 0 or period_s >= 0.05):
            raise ValueError("kernel_sample_period_s must be 0 (off) or >= 0.05 seconds, "
                             f"got {period_s!r}")
        self.period_s = float(period_s)

    @property
    def armed(self) -> bool:
        return self.enabled and self.period_s > 0

    # ------------------------------------------------------------------ loop thread
    def begin_step(self, step: int) -> bool:
        """Before a step's launch: whether it is sampled (then launch it inside `marked`)."""
        if not self.open:
            if (time.perf_counter() < self.next_at or self._submitted != self._converted
                    or sessions.unsaved()):
                # Never while the last sample converts: the worker shares the GIL with this
                # thread, and a CPU-bound step would show its conversion as idle GPU; nor
                # while any trace of ours waits to be written (a new session would zero its
                # CUDA times: engine/instruments/profiler_sessions.py).
                return False
            t0 = time.perf_counter_ns()
            try:
                if self._side is None:
                    # The bracket kernels' own stream: they order nothing of the step's.
                    self._side = torch.cuda.Stream()
                sessions.prime_profiler()
                sessions.start_kineto(self.with_cpu)
            except Exception as e:  # another profiler holds CUPTI: try next period
                self._failed(e)
                return False
            self.open, self.first, self.marks, self.spans = True, step, {}, {}
            self.open_warmup = self.warmup
            self.cost_ns = time.perf_counter_ns() - t0
        return step - self.first <= self.steps + self.open_warmup

    @contextmanager
    def marked(self, step: int) -> Iterator[None]:
        """Bracket a sampled step's launch between two zero-cycle spin kernels on a side
        stream: their correlation ids say which launch calls (and so which kernels) belong to
        this step, and their timestamps put the trace on the host clock."""
        side, clock = self._side, time.perf_counter_ns
        ctx = (torch.profiler.record_function(f"{STEP_MARKER}{step}") if self.with_cpu
               else nullcontext())
        with ctx:
            # (a, b) and (c, d) hold the launch call alone (the clock pair); the outer times
            # also hold the stream switches: all the time the bracket took from the step.
            a0 = clock()
            with torch.cuda.stream(side):
                a = clock()
                torch.cuda._sleep(0)
                b = clock()
            b0 = clock()
            try:
                yield
            finally:
                c0 = clock()
                with torch.cuda.stream(side):
                    c = clock()
                    torch.cuda._sleep(0)
                    d = clock()
                self.marks[step] = (a, b, c, d)
                self.spans[step] = (a0, b0, c0, clock())

    def step_done(self, step: int) -> None:
        """After a step's results were read: stop once the last marked step is done."""
        if self.open and step - self.first >= self.steps + self.open_warmup:
            self._stop(keep=True)

    def abort(self) -> None:
        """Drop a sample in progress (an anatomy recording wants the profiler)."""
        if self.open:
            self._stop(keep=False)

    def take(self) -> list[KernelSample]:
        out = []
        while self.ready:
            out.append(self.ready.popleft())
        return out

    def _stop(self, keep: bool) -> None:
        t0 = time.perf_counter_ns()
        self.open = False
        self.next_at = time.perf_counter() + self.period_s
        try:
            result = torch.autograd._disable_profiler()
        except Exception as e:
            self._failed(e)
            return
        cost = self.cost_ns + time.perf_counter_ns() - t0
        if keep and self.keep_results:
            self._submit((result, self.first + self.open_warmup, self.steps, dict(self.marks),
                          cost, dict(self.spans)), sessions.hold())

    def _failed(self, e: BaseException, retry_s: float | None = None) -> None:
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"
        self.next_at = time.perf_counter() + (max(self.period_s, 1.0) if retry_s is None
                                              else retry_s)
        if self.failures <= 3:
            log.warning("kernel sampler: %s", self.last_error)

    # ---------------------------------------------------------------------- worker
    def _submit(self, job: tuple[Any, int, int, dict, int, dict], token: int) -> None:
        if self._worker is None:
            self._jobs = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._work, name="gapless-kernels",
                                            daemon=True)
            self._worker.start()
        assert self._jobs is not None
        self._submitted += 1
        self._jobs.put((job, token))

    def _work(self) -> None:
        assert self._jobs is not None
        while (item := self._jobs.get()) is not None:
            try:
                sample = self._convert(*item)
                if sample is not None:
                    self.ready.append(sample)
            finally:  # counted once its sample is ready: the publisher waits on this count
                self._converted += 1

    def _convert(self, job: tuple[Any, int, int, dict, int, dict],
                 token: int) -> KernelSample | None:
        """One trace into a sample, on the worker; None when the sample is lost (counted)."""
        t0 = time.perf_counter()
        switch = sys.getswitchinterval()
        if CONVERT_SWITCH_S is not None:
            sys.setswitchinterval(CONVERT_SWITCH_S)
        try:
            sample = convert(*job)
        except NoRuntimeEvents as e:  # this Kineto: fall back to CPU activities
            self.with_cpu = True
            self._failed(e)
            return None
        except sessions.ClockLost as e:  # written after another session started: no times
            self.clock_lost += 1
            self._failed(e, retry_s=self.period_s)
            return None
        except LostKernels as e:  # the profiler dropped every counted step's kernels
            self.lost_samples += 1
            self.lost_in_row += 1
            self.warmup = min(2 * self.warmup + self.steps, MAX_WARMUP_STEPS)
            self._failed(e, retry_s=self.period_s)  # longer warm-up, same period
            return None
        except Exception as e:  # a bad trace loses one sample, never the loop
            self._failed(e)
            return None
        finally:
            sessions.release(token)
            sys.setswitchinterval(switch)
            self.convert_s.append(time.perf_counter() - t0)
        if sample is not None:
            if sample.skipped_steps:
                # Kineto/CUPTI drop the first kernel records of a session, more of them as
                # the process runs more sessions: warm up longer so that the counted steps
                # come after the loss.
                self.warmup = min(self.warmup + sample.skipped_steps + 1, MAX_WARMUP_STEPS)
            self.samples_made += 1
            self.lost_in_row = 0
        return sample

    @property
    def converting(self) -> bool:
        """A stopped sample is still being converted (its records wait for it)."""
        return self._submitted != self._converted

    def stats(self) -> dict[str, Any]:
        """What the engine's stats() reports of the sampler: samples made, samples whose
        kernel records the profiler lost (in all, and since the last good one), failures and
        the last error ("" if none)."""
        return {"kernel_sample_period_s": self.period_s,
                "kernel_samples_made": self.samples_made,
                "kernel_samples_lost": self.lost_samples,
                "kernel_samples_lost_in_row": self.lost_in_row,
                "kernel_sampler_failures": self.failures,
                "kernel_sampler_error": self.last_error or ""}

    def close(self) -> None:
        self.abort()
        if self._jobs is not None:
            self._jobs.put(None)


# How this process reads its traces: Kineto's JSON export (False, the default: the
# profiler's event objects are no faster and read graph rows low, docs/benchmarks.md), the
# event objects (True), or both on the first sample and the objects from then on where they
# gave the same sample faster (None until compared). `set_trace_reader` picks one by name.
TRACE_READERS = {"json": False, "objects": True, "compare": None}
READ_OBJECTS: bool | None = False
READ_TIMES: dict[str, float] = {}  # the first sample's conversion both ways, seconds


def set_trace_reader(name: str) -> None:
    """Read this process's traces by ``name``: one of TRACE_READERS (a bench compares them)."""
    global READ_OBJECTS
    if name not in TRACE_READERS:
        raise ValueError(f"trace reader must be one of {', '.join(TRACE_READERS)}, "
                         f"got {name!r}")
    READ_OBJECTS = TRACE_READERS[name]
    READ_TIMES.clear()


def convert(result: Any, first: int, steps: int, marks: dict[int, tuple[int, int, int, int]],
            cost_ns: int = 0, spans: dict[int, tuple[int, int, int, int]] | None = None,
            ) -> KernelSample | None:
    """One finished session's trace into a sample, by this process's trace reader."""
    global READ_OBJECTS
    if READ_OBJECTS is False:
        return to_sample(trace_events(result), first, steps, marks, cost_ns, spans)
    t0 = time.perf_counter()
    try:
        fast = to_sample(object_events(result), first, steps, marks, cost_ns, spans)
    except Exception as e:
        if READ_OBJECTS:
            raise
        log.warning("kernel sampler: reading the profiler's objects failed (%s); "
                    "using its JSON export", e)
        READ_OBJECTS = False
        return to_sample(trace_events(result), first, steps, marks, cost_ns, spans)
    if READ_OBJECTS is None:  # the first sample: both ways; objects only if same and faster
        t1 = time.perf_counter()
        slow = to_sample(trace_events(result), first, steps, marks, cost_ns, spans)
        READ_TIMES.update(objects_s=t1 - t0, json_s=time.perf_counter() - t1)
        READ_OBJECTS = _same(fast, slow) and READ_TIMES["objects_s"] < READ_TIMES["json_s"]
        if not READ_OBJECTS:
            log.info("kernel sampler: reading the profiler's JSON export (objects: same "
                     "sample %s, %s)", _same(fast, slow), READ_TIMES)
            return slow
    return fast
