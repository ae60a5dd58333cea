"""The rules every torch.profiler session of ours keeps: the kernel sampler's and the step
anatomy's.

Owns the process's profiler priming (`prime_profiler`), the CUDA-only Kineto start the
sampler uses (`start_kineto`), and the hold on a finished session whose trace is not written
yet (`hold` / `release` / `unsaved`), with the check that a written trace kept its CUDA times
(`clock_lost`). It never starts a session while a trace of ours waits to be written, and
never stops one: each instrument stops its own, on the thread that started it.

Why the hold: with CUPTI's TSC timestamps (Kineto's default on Linux), each CUDA record
(kernel, memcpy, runtime call) keeps its raw TSC value and is converted when the trace is
exported, through one process-wide converter (``libkineto::get_time_converter()``) that every
session start and stop replaces with one whose origin is its own session's start. A trace
exported after another session has started therefore reads every CUDA record at ts 0 with
dur 0, while its CPU ops and annotation ranges (converted at stop) keep real times. So no
session of ours starts while one is held: the sampler skips its turn, the anatomy waits a
step. A session started by someone else (a user's torch.profiler) cannot be held off, so a
written trace is checked and a bad one re-recorded (anatomy) or dropped (sampler), never
read as kernels at time 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

# A hold older than this is dropped (a caller that never wrote its trace must not stop the
# sampler forever); far above any export (an anatomy of 256 steps writes in seconds).
STALE_S = 120.0
CUDA_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")

_lock = threading.Lock()
_held: dict[int, float] = {}  # token -> perf_counter when held
_next = 0
_primed = False


class ClockLost(RuntimeError):
    """A trace whose CUDA events lost their times (see the module docstring)."""


def prime_profiler() -> None:
    """Once per process, before the first session of ours: a throwaway torch.profiler session
    (CPU and CUDA activities) on the thread that builds the engine, so that Kineto's client
    is initialised on the thread that registered it (else Kineto prints "External init
    callback must run in same thread as registerClient")."""
    global _primed
    if _primed or torch.autograd._profiler_enabled():
        return
    _primed = True
    with torch.profiler.profile():
        torch.cuda._sleep(0)


def start_kineto(with_cpu: bool) -> None:
    """Enable Kineto with CUDA activities (and CPU ones with ``with_cpu``); raises
    RuntimeError while another profiler runs."""
    from torch.autograd import ProfilerActivity, _enable_profiler, _prepare_profiler
    from torch.autograd.profiler import profile as autograd_profile

    if torch.autograd._profiler_enabled():
        raise RuntimeError("another profiler is running")
    cfg = autograd_profile(use_device="cuda", use_kineto=True)
    acts = {ProfilerActivity.CUDA} | ({ProfilerActivity.CPU} if with_cpu else set())
    _prepare_profiler(cfg.config(create_trace_id=True), acts)
    _enable_profiler(cfg.config(create_trace_id=False), acts)


def hold() -> int:
    """A session stopped and its trace is not written yet: no session of ours may start.
    Returns the token to `release`."""
    global _next
    with _lock:
        _next += 1
        _held[_next] = time.perf_counter()
        return _next


def release(token: int | None) -> None:
    if token is not None:
        with _lock:
            _held.pop(token, None)


def unsaved() -> bool:
    """Whether some trace of ours still waits to be written (stale holds are dropped)."""
    if not _held:
        return False
    now = time.perf_counter()
    with _lock:
        for token, t in list(_held.items()):
            if now - t > STALE_S:
                del _held[token]
        return bool(_held)


def clock_lost(events: Iterable[Mapping[str, Any]]) -> str | None:
    """Why a Chrome trace's CUDA events cannot be trusted, or None: more than half of them
    at ts 0, or outside the session's own span (Kineto's "Trace" event, on the CPU clock)
    by more than a second. A handful at 0 among real times are counted, not judged."""
    cuda = zero = outside = 0
    span: tuple[float, float] | None = None
    rows = [e for e in events if e.get("ph") == "X"]
    for e in rows:
        if e.get("cat") == "Trace" and "ts" in e:
            t = float(e["ts"])
            span = (t - 1e6, t + float(e.get("dur", 0)) + 1e6)
    for e in rows:
        if e.get("cat") not in CUDA_CATS:
            continue
        cuda += 1
        t = float(e.get("ts", 0))
        if t == 0.0:
            zero += 1
        elif span is not None and not span[0] <= t <= span[1]:
            outside += 1
    if cuda and 2 * (zero + outside) > cuda:
        return (f"{zero} of {cuda} CUDA events at ts 0 and {outside} outside the session's "
                "span: the trace was written after another profiler session had started "
                "(Kineto converts CUDA times at export with the latest session's converter)")
    return None
