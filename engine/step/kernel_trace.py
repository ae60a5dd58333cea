"""The kernel sampler: measured kernels of a few consecutive steps every period, always on.

Owns the engine's one profiler session for sampling (torch.profiler's Kineto/CUPTI backend,
driven through its low-level enable/disable calls). One process holds one CUPTI subscriber,
so the on-demand step anatomy (engine/step/anatomy.py) and this sampler take turns: while an
anatomy recording is asked for or running the sampler stays off, and a sample in progress is
dropped when one is asked for (the pipeline arbitrates; anatomy wins).

Every ``period_s`` (config kernel_sample_period_s, default 2 s; 0 = off) the next
``steps + 1`` steps are recorded: their launches are wrapped in ``gapless.step <n>`` ranges
(as the anatomy does), the profiler is stopped once the last of them has had its results
read (no sync: those kernels are done). The extra step only gives the window's end (its first
kernel). Stopping costs the loop thread the profiler's disable call; the trace is written,
read and grouped by step on a worker thread, and the finished `telemetry.kernels.KernelSample`
rides out on the next step record the loop publishes (``StepRecord.kernel_samples``).

Clock: kernel times come in the profiler's clock. Each marked step notes time.perf_counter_ns
just inside and just before leaving its range; the median difference of range midpoints puts
the trace on our clock (error about a microsecond; no assumption about which clock Kineto
uses).

Why torch.profiler: it is installed wherever torch is, and the anatomy already uses it.
cupti-python (NVIDIA's CUPTI bindings) would give the same activity records with less
overhead but is not installed on the GPU machine and would still have to share the one
subscriber; timestamps written by our own kernels (%globaltimer) need every kernel to be ours
(cuBLAS GEMMs are not) and measure only what we instrument.

It must never start while another profiler runs, never block the loop on the trace's
conversion, and never leave the profiler on after an error.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import statistics
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from telemetry.anatomy import STEP_MARKER, group_by_step
from telemetry.kernels import KernelRecord, KernelSample, SampledStep, family_of, make_sample

log = logging.getLogger("gapless.kernels")

DEFAULT_PERIOD_S = 2.0
DEFAULT_STEPS = 4
MAX_READY = 64


class KernelSampler:
    """The loop-thread half (``begin_step`` / ``step_done``) and its worker thread."""

    def __init__(self, *, enabled: bool, period_s: float = DEFAULT_PERIOD_S,
                 steps: int = DEFAULT_STEPS) -> None:
        self.set_period(period_s)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"kernel sample steps must be an int >= 1, got {steps!r}")
        self.steps = steps
        self.enabled = enabled
        self.next_at = time.perf_counter() + min(self.period_s, 0.5)
        self.open = False  # a profiler session of ours is on
        self.first = 0
        self.marks: dict[int, tuple[int, int]] = {}  # step -> perf ns inside its range
        self.cost_ns = 0
        self.ready: deque[KernelSample] = deque(maxlen=MAX_READY)  # for the next record
        self.samples_made = 0
        self.failures = 0
        self.last_error: str | None = None
        self._jobs: queue.SimpleQueue[tuple[Any, int, int, dict, int] | None] | None = None
        self._worker: threading.Thread | None = None

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
    def begin_step(self, step: int) -> str | None:
        """Before a step's launch: the range name to wrap it in when it is sampled."""
        if not self.open:
            if time.perf_counter() < self.next_at:
                return None
            t0 = time.perf_counter_ns()
            try:
                _start()
            except Exception as e:  # another profiler holds CUPTI: try next period
                self._failed(e)
                return None
            self.open, self.first, self.marks = True, step, {}
            self.cost_ns = time.perf_counter_ns() - t0
        return f"{STEP_MARKER}{step}" if step - self.first <= self.steps else None

    @contextmanager
    def marked(self, name: str, step: int) -> Iterator[None]:
        with torch.profiler.record_function(name):
            t_in = time.perf_counter_ns()
            try:
                yield
            finally:
                self.marks[step] = (t_in, time.perf_counter_ns())

    def step_done(self, step: int) -> None:
        """After a step's results were read: stop once the last marked step is done."""
        if self.open and step - self.first >= self.steps:
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
        if keep:
            self._submit((result, self.first, self.steps, dict(self.marks), cost))

    def _failed(self, e: BaseException) -> None:
        self.failures += 1
        self.last_error = f"{type(e).__name__}: {e}"
        self.next_at = time.perf_counter() + max(self.period_s, 1.0)
        if self.failures <= 3:
            log.warning("kernel sampler: %s", self.last_error)

    # ---------------------------------------------------------------------- worker
    def _submit(self, job: tuple[Any, int, int, dict, int]) -> None:
        if self._worker is None:
            self._jobs = queue.SimpleQueue()
            self._worker = threading.Thread(target=self._work, name="gapless-kernels",
                                            daemon=True)
            self._worker.start()
        assert self._jobs is not None
        self._jobs.put(job)

    def _work(self) -> None:
        assert self._jobs is not None
        while (job := self._jobs.get()) is not None:
            try:
                sample = convert(*job)
            except Exception as e:  # a bad trace loses one sample, never the loop
                self._failed(e)
                continue
            if sample is not None:
                self.samples_made += 1
                self.ready.append(sample)

    def close(self) -> None:
        self.abort()
        if self._jobs is not None:
            self._jobs.put(None)


def _start() -> None:
    """Enable Kineto with CPU (our step ranges, the launch calls) and CUDA activities."""
    from torch.autograd import ProfilerActivity, _enable_profiler, _prepare_profiler
    from torch.autograd.profiler import profile as autograd_profile

    if torch.autograd._profiler_enabled():
        raise RuntimeError("another profiler is running")
    cfg = autograd_profile(use_device="cuda", use_kineto=True)
    acts = {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    _prepare_profiler(cfg.config(create_trace_id=True), acts)
    _enable_profiler(cfg.config(create_trace_id=False), acts)


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


def to_sample(events: list[dict[str, Any]], first: int, steps: int,
              marks: dict[int, tuple[int, int]], cost_ns: int = 0) -> KernelSample | None:
    """Group a trace's kernels by marked step and put them on our clock (see the module
    docstring); steps first..first+steps-1 are counted, the next one ends the window."""
    offsets = []
    for e in events:
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and name.startswith(STEP_MARKER) and e.get("cat") in (
                "user_annotation", None):
            n = int(name[len(STEP_MARKER):])
            if n in marks:
                t_in, t_out = marks[n]
                mid_trace = (float(e["ts"]) + float(e.get("dur", 0)) / 2) * 1000.0
                offsets.append(mid_trace - (t_in + t_out) / 2)
    if not offsets:
        return None
    off = statistics.median(offsets)
    cats = ("kernel", "gpu_memset", "gpu_memcpy")
    by_step = {s.step: s for s in group_by_step(events, device_cats=cats, keep_marker=True)}
    sampled: list[SampledStep] = []
    next_start: int | None = None
    for n in range(first, first + steps + 1):
        s = by_step.get(n)
        if s is None or not s.kernels:
            continue
        ks = sorted((KernelRecord(k.name, family_of(k.name), round(k.start_us * 1000 - off),
                                  round(k.end_us * 1000 - off)) for k in s.kernels),
                    key=lambda k: k.start_ns)
        if n == first + steps:
            next_start = ks[0].start_ns
        else:
            sampled.append(SampledStep(n, ks))
    return make_sample(sampled, next_start, "annotation", cost_ns)


def convert(result: Any, first: int, steps: int, marks: dict[int, tuple[int, int]],
            cost_ns: int = 0) -> KernelSample | None:
    return to_sample(trace_events(result), first, steps, marks, cost_ns)
