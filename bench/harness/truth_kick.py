"""A reference window that lost every kernel record, tried again after a CUPTI "kick".

Some eager reference windows keep the launch calls of torch.profiler's trace but no kernel
record at all, from one window to the end of the mode: CUPTI produces none (Kineto's log says
so), and the next session that replays a CUDA graph has its kernels again. This module
tests that observation while it repairs the table:

- `kick()`: one short profiler session around an eager kernel, the replay of a one-kernel CUDA
  graph (captured here, outside the engine's graphs) and an eager kernel again; it returns what
  the session recorded (eager kernels before and after the replay, the graph's kernel) and the
  free GPU memory, so each loss in the results says what state CUPTI was in and whether the
  replay brought the records back;
- `with_retries(window)`: the reference window, and while it lost every kernel record (and
  ``retries`` allow), a kick and the window again on a fresh batch of the same prompts. Every
  attempt stays in the result (``attempts``): a row measured on its second try says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from bench.harness.trace import profiler_trace

RETRIES = 2
_STATE: dict[str, Any] = {}


def _graph() -> tuple[Any, Any]:
    """A one-kernel CUDA graph on a 1-element tensor, captured once per process."""
    if "graph" not in _STATE:
        x = torch.zeros(1, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.add_(1)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        # thread_local: the engine's loop thread (idle now, its batch aborted) is not ours
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            x.add_(1)
        _STATE["graph"] = (g, x)
    return _STATE["graph"]


def kernel_names(trace: dict[str, Any]) -> list[str]:
    return [str(e.get("name", "")) for e in trace.get("traceEvents", [])
            if e.get("cat") == "kernel"]


def _session(fn: Callable[[], None]) -> list[str]:
    """The kernel names one short profiler session (CUDA activities) recorded around fn()."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return kernel_names(profiler_trace(prof))


def _triton_kernel() -> Callable[[Any], None] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _bump(x_ptr):
        tl.store(x_ptr, tl.load(x_ptr) + 1)

    return lambda x: _bump[(1,)](x)


def probes(stream: Any = None) -> dict[str, int]:
    """Which launches a session records now, one session each: an eager kernel of this
    thread on the default stream, on the engine's compute stream (``stream``), from a new
    thread, a Triton kernel (launched through the driver API, as the engine's are) and the
    sampler's bracket kernel on a side stream. Says whether a loss is the thread's, the
    stream's, the launch API's, or everything's."""
    x = torch.zeros(1, device="cuda")
    out: dict[str, int] = {}

    def count(name: str, fn: Callable[[], None]) -> None:
        try:
            out[name] = len(_session(fn))
        except Exception as e:  # a probe must never end the run
            out[name] = -1
            out[f"{name}_error"] = f"{type(e).__name__}: {e}"  # type: ignore[assignment]

    count("main_default", lambda: x.mul_(1))
    if stream is not None:
        def on_stream() -> None:
            with torch.cuda.stream(stream):
                x.mul_(1)
        count("main_engine_stream", on_stream)

    def other_thread() -> None:
        t = threading.Thread(target=lambda: (x.mul_(1), torch.cuda.synchronize()))
        t.start()
        t.join()
    count("new_thread", other_thread)
    bump = _triton_kernel()
    if bump is not None:
        count("triton", lambda: bump(x))
    side = torch.cuda.Stream()

    def bracket() -> None:
        with torch.cuda.stream(side):
            torch.cuda._sleep(0)
    count("side_sleep", bracket)
    return out


def kick(stream: Any = None) -> dict[str, Any]:
    """One profiler session: eager mul, graph replay (an add), eager mul; what it recorded;
    then `probes` (which kinds of launch a session records now)."""
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {"free_mib": free // 2**20, "total_mib": total // 2**20}
    g, x = _graph()

    def replay() -> None:
        x.mul_(1)
        g.replay()
        x.mul_(1)
    names = _session(replay)
    out.update(kick="graph", kernels=len(names),
               eager_kernels=sum("mul" in n.lower() for n in names),
               graph_kernels=sum("add" in n.lower() for n in names), names=names[:6],
               probes=probes(stream))
    return out


def lost_all(ref: dict[str, Any]) -> bool:
    """The window launched kernels and the trace kept none of them."""
    return ref.get("busy") is None and bool(ref.get("lost_launches"))


def with_retries(window: Callable[[], tuple[dict[str, Any], list, int, int]], cuda: bool,
                 retries: int = RETRIES, kicker: Callable[[], dict[str, Any]] = kick,
                 ) -> tuple[dict[str, Any], list, int, int]:
    """``window()`` -> (reference, its intervals, start ns, end ns); again after a kick while
    it lost every kernel record. The result is the last attempt's, with every attempt listed
    under ``attempts`` (busy, lost launches, the kick before it) when there was more than one."""
    ref, iv, t0, t1 = window()
    attempts: list[dict[str, Any]] = []
    while cuda and lost_all(ref) and len(attempts) < retries:
        attempts.append({"busy": ref.get("busy"), "lost_launches": ref.get("lost_launches"),
                         "why": ref.get("why"), "kick_after": kicker()})
        ref, iv, t0, t1 = window()
    if attempts:
        attempts.append({"busy": ref.get("busy"), "lost_launches": ref.get("lost_launches"),
                         "why": ref.get("why")})
        ref = {**ref, "attempts": attempts}
    return ref, iv, t0, t1


def attempts_markdown(shapes: dict[str, Any]) -> list[str]:
    """The reference windows that needed more than one try, and what each kick recorded."""
    lines: list[str] = []
    for preset, sh in shapes.items():
        for mode, r in sh["modes"].items():
            for i, rep in enumerate(r.get("repeats") or []):
                for j, a in enumerate(rep.get("attempts") or []):
                    k = a.get("kick_after") or {}
                    kicked = ("" if not k else
                              f"; then a kick: {k.get('kick')}, {k.get('kernels', '-')} kernel "
                              f"records (eager {k.get('eager_kernels', '-')}, graph "
                              f"{k.get('graph_kernels', '-')}), {k.get('free_mib')} MiB free"
                              + ("; probes " + ", ".join(f"{n} {v}" for n, v in
                                                         k["probes"].items())
                                 if k.get("probes") else ""))
                    busy = a.get("busy")
                    lines.append(f"| {preset} | {mode} | {i + 1} | {j + 1} | "
                                 + ("kept its kernels" if busy is not None else
                                    f"lost {a.get('lost_launches')} launches' kernels")
                                 + kicked + " |")
    if not lines:
        return []
    return ["", "## Reference windows tried again (every kernel record lost)", "",
            "| shape | mode | repeat | try | what the trace kept, and the kick after it |",
            "|---|---|---:|---:|---|", *lines]
