"""The kernel sampler: measured kernels of a few consecutive steps every period, always on.

Owns the engine's profiler session for sampling (torch.profiler's Kineto backend, CUDA
activities only) and its worker thread: every ``period_s`` the next warm-up + ``steps`` + 1
steps are recorded, each sampled launch bracketed by two zero-cycle spin kernels on a side
stream whose correlation ids tell which launch calls (and so which kernels) belong to which
step; the trace is grouped by step on the worker (kernel_trace_read.py) and put on the host
clock from the brackets' own timestamps. A sample reaches the bus on the record of the step
that closed its window (`SamplePublisher`). It takes turns with the step anatomy (one CUPTI
subscriber per process: the anatomy wins, engine/instruments/observer.py arbitrates).

It must never start while another profiler runs, never start or stop a session off the loop
thread, never block the loop on a conversion, and never leave the profiler on after an error.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

from engine.instruments import kernel_trace_clock as clock
from engine.instruments.kernel_trace_read import (
    LostKernels,
    NoRuntimeEvents,
    _same,
    object_events,
    to_sample,
    trace_events,
)
from telemetry.anatomy import STEP_MARKER
from telemetry.kernels import KernelSample

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
# finds the profiler dropped kernels of its counted steps (see `KernelSampler._work`).
WARMUP_STEPS = 1
MAX_WARMUP_STEPS = 32


class KernelSampler:
    """The loop-thread half (``begin_step`` / ``step_done``) and its worker thread."""

    def __init__(self, *, enabled: bool, period_s: float = DEFAULT_PERIOD_S,
                 steps: int = DEFAULT_STEPS) -> None:
        self.set_period(period_s)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"kernel sample steps must be an int >= 1, got {steps!r}")
        if enabled and torch.cuda.is_available():
            try:
                prime_profiler()  # on the thread that builds the engine (see there)
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
        self.clock_lost = 0  # traces whose CUDA times were lost (kernel_trace_clock)
        self.last_error: str | None = None
        self._jobs: queue.SimpleQueue[tuple[tuple, int] | None] | None = None
        self._worker: threading.Thread | None = None
        # samples handed to the worker / done by it (each counter written by one thread)
        self._submitted = self._converted = 0
        self.convert_s: deque[float] = deque(maxlen=64)  # worker seconds per conversion
        # False only to measure the sampler's cost without its conversion (bench truth-cost)
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
                    or clock.unsaved()):
                # Never while the last sample converts: the worker shares the GIL with this
                # thread, and a CPU-bound step would show its conversion as idle GPU; nor
                # while any trace of ours waits to be written (a new session would zero its
                # CUDA times: engine/instruments/kernel_trace_clock.py).
                return False
            t0 = time.perf_counter_ns()
            try:
                if self._side is None:
                    # The bracket kernels' own stream: they order nothing of the step's.
                    self._side = torch.cuda.Stream()
                prime_profiler()
                _start(self.with_cpu)
            except Exception as e:  # another profiler holds CUPTI: try next period
                self._failed(e)
                return False
            self.open, self.first, self.marks, self.spans = True, step, {}, {}
            self.open_warmup = self.warmup
            self.cost_ns = time.perf_counter_ns() - t0
        return step - self.first <= self.steps + self.open_warmup

    @contextmanager
    def marked(self, step: int) -> Iterator[None]:
        """Bracket a sampled step's launch (see the module docstring)."""
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
                          cost, dict(self.spans)), clock.hold())

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
        except clock.ClockLost as e:  # written after another session started: no times
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
            _dump(job, e)
            return None
        finally:
            clock.release(token)
            sys.setswitchinterval(switch)
            self.convert_s.append(time.perf_counter() - t0)
        if sample is not None and self.samples_made < 2 and os.environ.get(
                "GAPLESS_KERNEL_TRACE_DUMP_ALL"):
            _dump(job, None, os.environ["GAPLESS_KERNEL_TRACE_DUMP_ALL"])
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


def _dump(job: tuple[Any, int, int, dict, int, dict], error: BaseException | None,
          folder: str | None = None) -> None:
    """With GAPLESS_KERNEL_TRACE_DUMP=<folder>, a trace that failed to convert is kept there
    (events and our bracket times) for a look off the GPU machine; with
    GAPLESS_KERNEL_TRACE_DUMP_ALL=<folder>, the first two that converted too."""
    folder = folder or os.environ.get("GAPLESS_KERNEL_TRACE_DUMP")
    if not folder:
        return
    try:
        result, first, steps, marks = job[:4]
        try:
            events: list[dict[str, Any]] | None = trace_events(result)
        except Exception:  # "Trace is already saved": the JSON reader wrote it once
            events = None
        os.makedirs(folder, exist_ok=True)
        name = "failed-sample" if error is not None else "sample"
        stamp = time.strftime("%H%M%S") + f"-{time.perf_counter_ns() % 10**6:06d}"
        with open(os.path.join(folder, f"{name}-{stamp}-{first}.json"), "w") as f:
            json.dump({"error": str(error), "first": first, "steps": steps,
                       "marks": {str(k): v for k, v in marks.items()},
                       "events": events, "object_events": _objects_or_none(result),
                       "spans": {str(k): v for k, v in (job[5] or {}).items()}}, f)
    except Exception as e:  # diagnostics must never take the worker down
        log.warning("kernel sampler: dump failed: %s", e)


_PRIMED = False


def prime_profiler() -> None:
    """Once per process, before the first session of ours: a throwaway torch.profiler session
    (CPU and CUDA activities) on the thread that builds the engine, so that Kineto's client
    is initialised on the thread that registered it (else Kineto prints "External init
    callback must run in same thread as registerClient"). CUDA events at ts 0 have another
    cause: a trace written after the next session started (kernel_trace_clock.py)."""
    global _PRIMED
    if _PRIMED or torch.autograd._profiler_enabled():
        return
    _PRIMED = True
    with torch.profiler.profile():
        torch.cuda._sleep(0)


def _objects_or_none(result: Any) -> list[dict[str, Any]] | None:
    try:
        return object_events(result)
    except Exception:  # a dump must never fail on the second reader
        return None


def _start(with_cpu: bool) -> None:
    """Enable Kineto with CUDA activities (and CPU ones in the fallback)."""
    from torch.autograd import ProfilerActivity, _enable_profiler, _prepare_profiler
    from torch.autograd.profiler import profile as autograd_profile

    if torch.autograd._profiler_enabled():
        raise RuntimeError("another profiler is running")
    cfg = autograd_profile(use_device="cuda", use_kineto=True)
    acts = {ProfilerActivity.CUDA} | ({ProfilerActivity.CPU} if with_cpu else set())
    _prepare_profiler(cfg.config(create_trace_id=True), acts)
    _enable_profiler(cfg.config(create_trace_id=False), acts)


# Which way traces are read: Kineto's JSON export (the default), or with
# GAPLESS_KERNEL_TRACE_READ=objects the profiler's objects where the first sample finds them
# the same and faster (None until it compared the two, per process; =objects-only: always the
# objects, to compare the two readers on a GPU). The export is the default because the
# objects were no faster and read graph rows low (docs/benchmarks.md).
READ_OBJECTS: bool | None = {"objects": None, "objects-only": True}.get(
    os.environ.get("GAPLESS_KERNEL_TRACE_READ", "json"), False)
READ_TIMES: dict[str, float] = {}  # the first sample's conversion both ways, seconds


def convert(result: Any, first: int, steps: int, marks: dict[int, tuple[int, int, int, int]],
            cost_ns: int = 0, spans: dict[int, tuple[int, int, int, int]] | None = None,
            ) -> KernelSample | None:
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
