"""Kernel records lost at the start of profiler sessions (issue 20): how many, and which.

On the H200 (2026-12-04, 37c6b63) a profiler window late in a long test process kept the
CUDA runtime calls and the memcpys but not one kernel, and sampled graph steps read kernel
busy 3 pp under torch.profiler. pytorch issue 192021 reports that Kineto/CUPTI hand back the
first kernel records of each session with timestamps outside the session, which Kineto then
drops, more of them the more sessions a process has run (the timestamp callback is
registered again at every session). This experiment measures it in a fresh process, with the
kernel sampler's own way of starting and stopping the profiler (CUDA activities only):

- ``--sessions`` sessions back to back, each launching ``--launches`` one-element kernels
  and replaying a captured graph (a marker kernel then ``--body`` kernels) twice, synced;
  then ``--idle-sessions`` more with ``--idle-s`` of GPU idle before each, 10 more back to
  back, and 10 whose kernels another thread launches.
- Per session: the launches kept (a kernel record for the call's correlation id), whether
  the lost ones are the first ones (a head loss: warm-up steps absorb it) or scattered, and
  the graph replays' kernels kept against the graph's size (a replay that lost its first
  kernels lost its marker).
- The first session of the process is reported apart (it pays CUPTI's start-up).

    python -m bench truth-sessions                 # an H200, ~20 s
    python -m bench truth-sessions --clock-only    # only the export-order check, ~3 s

The export-order check (``clock``, run last): a CPU + CUDA session's trace written at once,
after another session has started, and after another session has run and stopped; counts
its CUDA events at ts 0 (engine/instruments/kernel_trace_clock.py says why they would be).
    python -m bench truth-sessions --device cpu    # CPU: says there is nothing to measure
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import report
from bench.harness.trace import profiler_trace
from bench.harness.workload import default_device

DESCRIPTION = "profiler sessions: kernel records lost at each session's start (pytorch #192021)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--idle-sessions", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=0.2)
    parser.add_argument("--launches", type=int, default=64)
    parser.add_argument("--body", type=int, default=32)
    parser.add_argument("--clock-only", action="store_true",
                        help="only the export-order check (CUDA times lost at export)")


def clock_check(x: torch.Tensor) -> dict[str, Any]:
    """CUDA events at ts 0 in a session's trace by when it is written: at once, after the
    next session started (the sampler's low-level start), after it also stopped."""

    from torch.profiler import ProfilerActivity, profile

    from engine.instruments.kernel_trace import _start
    from engine.instruments.kernel_trace_clock import CUDA_CATS, clock_lost

    def session() -> Any:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                x.add_(1)
            torch.cuda.synchronize()
        return prof

    def written(prof: Any) -> dict[str, Any]:
        try:
            ev = profiler_trace(prof)["traceEvents"]
        except Exception as e:  # say what happened, keep the other cases
            return {"error": f"{type(e).__name__}: {e}"}
        cuda = [e for e in ev if e.get("cat") in CUDA_CATS]
        return {"cuda_events": len(cuda),
                "at_ts_0": sum(1 for e in cuda if float(e.get("ts", 0)) == 0.0),
                "lost": clock_lost(ev)}

    out = {"written_at_once": written(session())}
    prof = session()
    _start(False)  # the next session starts before this trace is written
    try:
        out["written_after_next_started"] = written(prof)
    finally:
        torch.autograd._disable_profiler()
    prof = session()
    session()  # a whole session runs in between
    out["written_after_next_ran"] = written(prof)
    return out


def one_session(x: torch.Tensor, g: Any, launches: int, body: int,
                other_thread: bool = False) -> dict[str, Any]:
    """One session; with ``other_thread`` the kernels are launched by another thread than
    the one that starts and stops the profiler (as the truth suite's reference window does
    while the engine's loop thread launches)."""
    from engine.instruments.kernel_trace import _start
    from engine.instruments.kernel_trace_read import object_events

    def work() -> None:
        for _ in range(launches):
            x.add_(1)
        g.replay()
        g.replay()
        torch.cuda.synchronize()

    _start(False)
    if other_thread:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    else:
        work()
    events = object_events(torch.autograd._disable_profiler())
    have: dict[Any, int] = {}
    for e in events:
        if e["cat"] == "kernel":
            c = e["args"]["correlation"]
            have[c] = have.get(c, 0) + 1
    runtime = sorted((e for e in events if e["cat"] == "cuda_runtime"), key=lambda e: e["ts"])
    eager = [e for e in runtime if "LaunchKernel" in e["name"]]
    graph = [e for e in runtime if "GraphLaunch" in e["name"]]
    kept = [have.get(e["args"]["correlation"], 0) > 0 for e in eager]
    # A kept kernel that starts before its own launch call has a corrupted time that was
    # not dropped; the launch-to-start delay shows a shift common to the whole session.
    start = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "kernel"}
    delays = [start[e["args"]["correlation"]] - e["ts"] for e in eager
              if e["args"]["correlation"] in start]
    lost = kept.count(False)
    head = kept.index(True) if True in kept else len(kept)  # lost before the first kept
    return {"launches": len(eager), "lost": lost, "head": head, "scattered": lost - head,
            "graph_kernels": [have.get(e["args"]["correlation"], 0) for e in graph],
            "graph_size": body + 1,
            "before_launch": sum(1 for d in delays if d < 0),
            "launch_to_start_us_median": statistics.median(delays) if delays else None,
            "memcpy_or_other": sum(1 for e in events if e["cat"] in ("gpu_memcpy",
                                                                    "gpu_memset"))}


def kineto_strings(patterns: tuple[bytes, ...] = (b"TSC", b"Tsc", b"KINETO_"),
                   limit: int = 120) -> dict[str, list[str]]:
    """The printable strings around ``patterns`` in torch's libraries: Kineto's config keys
    and environment variables that mention its TSC timestamps (the callback pytorch issue
    192021 names), for the next step without a network."""
    out: dict[str, list[str]] = {}
    for f in sorted(Path(torch.__file__).parent.glob("lib/libtorch_c*.so")):
        b, found = f.read_bytes(), set()
        for pat in patterns:
            i, hits = b.find(pat), 0
            while i != -1 and len(found) < limit and hits < 3000:
                hits += 1
                lo, hi = i, i
                while lo > 0 and 32 <= b[lo - 1] < 127 and i - lo < 60:
                    lo -= 1
                while hi < len(b) and 32 <= b[hi] < 127 and hi - i < 60:
                    hi += 1
                found.add(b[lo:hi].decode("ascii", "replace"))
                i = b.find(pat, i + 1)
        out[f.name] = sorted(found)
    return out


def phase_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    lost = [r["lost"] for r in rows]
    return {"sessions": len(rows), "lost_mean": statistics.fmean(lost) if lost else None,
            "lost_first_10": lost[:10], "lost_last_10": lost[-10:],
            "sessions_with_loss": sum(1 for x in lost if x),
            "scattered_total": sum(r["scattered"] for r in rows),
            "kept_before_launch": sum(r["before_launch"] for r in rows),
            "graph_replays_short": sum(1 for r in rows for k in r["graph_kernels"]
                                       if k < r["graph_size"]),
            "graph_replays": sum(len(r["graph_kernels"]) for r in rows)}


def run(args: argparse.Namespace, out: Path) -> dict:
    if args.device != "cuda" or not torch.cuda.is_available():
        print("truth-sessions: no CUDA device: there are no kernel records to lose")
        return {"device": "cpu"}
    x = torch.zeros(1, device="cuda")
    m = torch.zeros(1, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            m.bitwise_not_()
            for _ in range(args.body):
                x.add_(1)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m.bitwise_not_()  # the marker: a replay that lost its first kernel lost this
        for _ in range(args.body):
            x.add_(1)
    torch.cuda.synchronize()
    if args.clock_only:
        clock = clock_check(x)
        print(f"export order: {clock}")
        report.write_json(out / "truth_clock.json", clock)
        return {"clock": clock}
    t0 = time.perf_counter()
    first = one_session(x, g, args.launches, args.body)
    first_s = time.perf_counter() - t0
    print(f"first session of the process ({first_s:.2f} s): {first}")
    busy = [one_session(x, g, args.launches, args.body) for _ in range(args.sessions)]
    idle = []
    for _ in range(args.idle_sessions):
        time.sleep(args.idle_s)
        idle.append(one_session(x, g, args.launches, args.body))
    after = [one_session(x, g, args.launches, args.body) for _ in range(10)]
    threaded = [one_session(x, g, args.launches, args.body, other_thread=True)
                for _ in range(10)]
    clock = clock_check(x)  # last: the first session above must be the process's first
    print(f"export order: {clock}")
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "clock": clock, "first_session": first, "first_session_s": first_s,
        "back_to_back": phase_summary(busy), "after_idle": phase_summary(idle),
        "back_to_back_after_idle": phase_summary(after),
        "launched_by_another_thread": phase_summary(threaded),
        "args": {k: getattr(args, k) for k in ("sessions", "idle_sessions", "idle_s",
                                                "launches", "body")}}
    for k in ("back_to_back", "after_idle", "back_to_back_after_idle",
              "launched_by_another_thread"):
        print(f"{k}: {summary[k]}")
    report.write_json(out / "truth_sessions.json", summary)
    rows = [[k, v["sessions"], v["lost_mean"], v["sessions_with_loss"], v["scattered_total"],
             f"{v['graph_replays_short']}/{v['graph_replays']}",
             " ".join(map(str, v["lost_first_10"])), " ".join(map(str, v["lost_last_10"]))]
            for k, v in summary.items() if isinstance(v, dict) and "lost_mean" in v]
    report.write_markdown(out / "truth_sessions.md", "Kernel records lost per profiler session", [
        f"{summary['device']}, torch {summary['torch']}; {args.launches} launches and 2 "
        f"replays of a {args.body + 1}-kernel graph per session; first session: "
        f"{first['lost']} of {first['launches']} launches lost, graph kernels "
        f"{first['graph_kernels']}", "",
        report.markdown_table(["phase", "sessions", "lost launches (mean)", "sessions with "
                               "loss", "lost not at the head", "graph replays short",
                               "lost, first 10", "lost, last 10"], rows)])
    t0 = time.perf_counter()  # last: reading torch's libraries is the slow part
    summary["kineto_strings"] = kineto_strings()
    print(f"kineto strings ({time.perf_counter() - t0:.1f} s): {summary['kineto_strings']}")
    report.write_json(out / "truth_sessions.json", summary)
    return summary
