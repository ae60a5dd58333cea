"""One profiler trace at a time until it is written: Kineto's CUDA times are converted at
export, with a converter the next session replaces.

Why (read in pytorch/kineto and torch's profiler_kineto.cpp): with CUPTI's TSC
timestamps (Kineto's default on Linux), each CUDA record (kernel, memcpy, runtime call) keeps
its raw TSC value, and ``timestamp()`` converts it *when it is called*, through one
process-wide function, ``libkineto::get_time_converter()``. Every profiler session replaces
that function: Kineto's ``configure()`` at session start, torch's ``finalizeTrace()`` at
stop, each with a converter whose origin is its own session's start and which returns 0 for
any earlier time. So a trace exported after another session has started converts every CUDA
record with the wrong origin: ts 0, dur 0. CPU ops and the GPU user-annotation ranges are
converted while the session is processed at stop, so they keep real times.

It happens when the anatomy stops its session on the loop thread, the caller's thread
exports the trace a little later, and in between the kernel sampler starts a session: every
kernel, memcpy and runtime call of the anatomy's recording then sits at ts 0 while its ranges
keep real times.

So: a finished session whose trace is not written yet is *held* here (`hold` / `release`);
no session of ours starts while one is held (`unsaved`): the sampler skips its turn, the
anatomy waits a step. A session started by someone else (a user's torch.profiler) cannot be
held off, so traces are also checked (`clock_lost`) and a bad one is re-recorded (anatomy)
or dropped (sampler), never read as kernels at time 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

# A hold older than this is dropped (a caller that never wrote its trace must not stop the
# sampler forever); far above any export (an 8B anatomy of 256 steps writes in seconds).
STALE_S = 120.0
CUDA_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")

_lock = threading.Lock()
_held: dict[int, float] = {}  # token -> perf_counter when held
_next = 0


class ClockLost(RuntimeError):
    """A trace whose CUDA events lost their times (see the module docstring)."""


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
