"""Step anatomy on demand: record the kernels of the next N steps with torch.profiler.

Owns the engine-side recording. A caller (any thread) asks for N steps with
`record_anatomy(engine, n_steps)`; the pipeline, on the loop thread, starts torch.profiler
(Kineto: CPU ops and CUDA kernels) at the next step's launch, wraps each of the N steps'
launches in a ``gapless.step <n>`` range, and stops the profiler once the last of them has
had its results read (so all its kernels are done; in async mode the launch of the step
after it falls inside the recording too, unmarked). The caller then gets the Chrome trace
(Perfetto opens it) and the steps grouped into kernels and families (telemetry.anatomy).
Until the caller has written the trace no other session of ours starts (Kineto converts CUDA
times at export with the latest session's converter: engine/instruments/profiler_sessions.py),
and a trace whose CUDA events lost their times anyway is recorded once more.

Zero cost when off: the pipeline tests one attribute per step. While recording, the profiler
slows the engine (CUPTI callbacks, and the stop synchronises): figures measured during a
recording are the recording's, not normal serving's. It must never start a recording
while one is running (ValueError), and never leave the profiler running (an error in the
loop stops it).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.instruments import profiler_sessions as sessions
from engine.instruments.step_floor import engine_step_floors
from telemetry.anatomy import (
    STEP_MARKER,
    GapCalibration,
    StepKernels,
    gap_calibration,
    group_by_step,
    step_key,
    summary_dict,
)

MAX_STEPS = 256
# Run under the profiler before the recorded steps, not recorded: Kineto/CUPTI can lose a
# session's first kernel records (a graph step recorded first can come out with none).
WARMUP_STEPS = 2


@dataclass(slots=True)
class AnatomyRecording:
    """What a recording gave: the raw trace events, their path, and the grouped steps."""

    n_steps: int
    trace_path: str
    events: list[dict[str, Any]]
    steps: list[StepKernels]
    first_step: int
    device: str
    wall_s: float
    # In-step gaps per step key, for estimating kernel busy from step busy (None when the
    # recorded steps' records were not on the bus: telemetry off).
    calibration: GapCalibration | None = None
    # Each recorded step's byte floor at peak copy and its separate-kernel reference
    # (engine/instruments/step_floor.py, from the engine's start-up curve); empty on a CPU
    floors: dict[int, dict[str, Any]] = field(default_factory=dict)
    # Why a first recording was discarded and this one made (its CUDA events had lost their
    # times: engine/instruments/profiler_sessions.py); None when the first one was good
    retried: str | None = None


@dataclass(slots=True)
class _Request:
    n_steps: int
    trace_dir: str
    done: threading.Event = field(default_factory=threading.Event)
    first_step: int | None = None
    prof: Any = None
    error: BaseException | None = None
    t0: float = 0.0
    hold: int | None = None  # profiler_sessions: our trace is not written yet
    abandoned: bool = False  # the caller gave up: nobody will write the trace


class AnatomyRecorder:
    """The loop-thread half: while ``active``, the pipeline calls `begin_step` before each
    launch and `step_done` once each step's results are read. ``cuda`` says whether the
    engine's streams are CUDA streams (else host-emulated: work runs on their threads)."""

    __slots__ = ("_lock", "_pending", "_active", "_prof", "active", "cuda", "warmup")

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self._lock = threading.Lock()
        self._pending: _Request | None = None
        self._active: _Request | None = None
        self._prof: Any = None
        self.active = False  # the one attribute the hot path reads
        # Steps run under the profiler before the recorded ones; the pipeline raises it to
        # the kernel sampler's, which learns how many steps' kernels a session start loses.
        self.warmup = WARMUP_STEPS

    def request(self, n_steps: int, trace_dir: str) -> _Request:
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or not (
                1 <= n_steps <= MAX_STEPS):
            raise ValueError(f"n_steps must be an integer in 1..{MAX_STEPS}, got {n_steps!r}")
        with self._lock:
            if self._pending is not None or self._active is not None:
                raise ValueError("a step-anatomy recording is already running; wait for it")
            req = _Request(n_steps, trace_dir)
            self._pending = req
            self.active = True
        return req

    def cancel(self, req: _Request) -> None:
        with self._lock:
            if self._pending is req:
                self._pending = None
                self.active = self._active is not None

    def abandon(self, req: _Request) -> None:
        """The caller stopped waiting: a trace it will never write must not be held."""
        with self._lock:
            req.abandoned = True
            sessions.release(req.hold)
            req.hold = None

    def begin_step(self, step: int) -> str | None:
        """Called on the loop thread before a step's launch, only while ``active``: starts
        a pending recording, and returns the range name to wrap this step's work in (None
        when the step is not recorded)."""
        try:
            with self._lock:
                if (self._active is None and self._pending is not None
                        and not (self.cuda and sessions.unsaved())):
                    # (while another trace of ours waits to be written, a new session would
                    # zero its CUDA times: the recording starts a step later)
                    self._active, self._pending = self._pending, None
                    # The step during which the profiler starts is not recorded: its first
                    # launches pay CUPTI's start-up (a graph step's kernels can be lost from
                    # the trace), as the kernel sampler's warm-up step.
                    self._active.first_step = step + self.warmup
                    self._active.t0 = time.perf_counter()
                    self._start()
                req = self._active
                if req is None:
                    self.active = self._pending is not None
                    return None
        except BaseException as e:  # never leave the profiler running behind an error
            self._finish(e)
            return None
        assert req.first_step is not None
        return (f"{STEP_MARKER}{step}" if 0 <= step - req.first_step < req.n_steps
                else None)

    def step_done(self, step: int) -> None:
        """Called on the loop thread once a step's results are read, only while ``active``:
        the recording stops after its last step (all that step's kernels are done)."""
        req = self._active
        if req is not None and req.first_step is not None and (
                step - req.first_step >= req.n_steps - 1):
            self._finish(None)

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        if self.cuda:
            sessions.prime_profiler()  # the process's first session loses its first steps' kernels
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        else:
            # Host-emulated streams run the work on their own threads, which a profiler
            # started here sees only with profile_all_threads (torch >= 2.6 or so).
            try:
                from torch._C._profiler import _ExperimentalConfig

                cfg = _ExperimentalConfig(profile_all_threads=True)
                prof = profile(activities=[ProfilerActivity.CPU], experimental_config=cfg)
            except TypeError:
                prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
        self._prof = prof

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            req, self._active = self._active, None
            prof, self._prof = self._prof, None
            self.active = self._pending is not None
            if req is not None and prof is not None and self.cuda and not req.abandoned:
                req.hold = sessions.hold()  # until the caller wrote the trace
        if req is None:
            return
        try:
            if prof is not None:
                prof.__exit__(None, None, None)  # stop here, on the thread that started it
                req.prof = prof  # the caller's thread writes the trace: the loop goes on
        except BaseException as e:
            error = error or e
        req.error = error
        req.done.set()



def marked(name: str, fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` run inside a profiler range ``name`` (for work run on a host stream's thread)."""

    def run() -> None:
        with torch.profiler.record_function(name):
            fn()

    return run


def record_anatomy(engine: Any, n_steps: int, timeout_s: float = 60.0,
                   trace_dir: str | None = None, _retried: str | None = None,
                   ) -> AnatomyRecording:
    """Record the next ``n_steps`` steps the engine runs (it must be serving requests, or
    get some within ``timeout_s``). Returns the trace path and the grouped steps. Raises
    ValueError for bad arguments or a recording already running, TimeoutError when the
    steps did not come. A CUDA trace whose CUDA events lost their times is recorded once
    more (``retried`` says why); twice bad raises profiler_sessions.ClockLost."""
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    recorder: AnatomyRecorder = engine.instruments.anatomy
    req = recorder.request(n_steps, trace_dir or tempfile.gettempdir())
    if not req.done.wait(timeout_s):
        recorder.cancel(req)
        if not req.done.wait(5.0):  # started meanwhile: let the loop finish it
            recorder.abandon(req)
            raise TimeoutError(
                f"step anatomy: {n_steps} steps did not run within {timeout_s:g} s; "
                "is the engine serving requests?")
    try:
        if req.error is not None:
            raise RuntimeError(f"step anatomy recording failed: {req.error}") from req.error
        assert req.prof is not None and req.first_step is not None
        fd, trace_path = tempfile.mkstemp(prefix="gapless-anatomy-", suffix=".json",
                                          dir=req.trace_dir)
        os.close(fd)
        req.prof.export_chrome_trace(trace_path)
    finally:
        recorder.abandon(req)  # written (or failed): the next session may start
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    lost = sessions.clock_lost(events) if recorder.cuda else None
    if lost is not None:
        if _retried is not None:
            raise sessions.ClockLost(f"step anatomy: recorded twice, both traces unusable: {lost}")
        return record_anatomy(engine, n_steps, timeout_s, trace_dir,
                              _retried=f"first recording ({trace_path}) discarded: {lost}")
    device = "cuda" if any(e.get("cat") == "kernel" for e in events) else "cpu"
    cats = ("kernel", "gpu_memcpy", "gpu_memset") if device == "cuda" else ("cpu_op",)
    steps = group_by_step(events, device_cats=cats)
    wanted = {s.step for s in steps}
    bus = getattr(engine, "bus", None)
    records = bus.snapshot_steps(4 * n_steps + 16) if bus is not None else []
    key_of = {r.step: step_key(r.graph_bucket, r.num_tokens) for r in records
              if r.step in wanted}
    cal = gap_calibration(steps, key_of)
    floors = engine_step_floors(engine, [r for r in records if r.step in wanted])
    return AnatomyRecording(n_steps, trace_path, events, steps, req.first_step, device,
                            time.perf_counter() - req.t0, cal if cal.steps else None, floors,
                            _retried)


def anatomy_summary(rec: AnatomyRecording, floor_bytes: int | None = None,
                    peak_bw: float | None = None) -> dict[str, Any]:
    """Plain data (picklable, JSON-able) for a client across the process boundary: see
    telemetry.anatomy.summary_dict."""
    out = summary_dict(rec.steps, device=rec.device, first_step=rec.first_step,
                       trace_path=rec.trace_path, floor_bytes=floor_bytes, peak_bw=peak_bw,
                       calibration=rec.calibration)
    out["retried"] = rec.retried
    for row in out["steps"]:  # each step's floor and reference, where the engine has a curve
        f = rec.floors.get(row["step"])
        if f is None:
            continue
        row.update(f)
        for key, base_us in (("x_peak_floor", f["peak_floor_us"]),
                             ("x_separate_kernel_reference", f["separate_kernel_reference_us"])):
            row[key] = row["span_us"] / base_us if base_us else None
    return out
