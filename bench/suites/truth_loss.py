"""Which process history makes the profiler lose every kernel record of an eager window (issue 20).

On the H200 (5f96d07, d8db309, 6aadddc) whole eager windows came back from torch.profiler with
their runtime calls and memcpys but not one kernel record (the reference and the sampler
alike), always late in a process that had run graph modes first, never in a fresh process
(truth-sessions). Each scenario here runs in a fresh process, does the steps its recipe names,
and counts, per profiler session, the kernel launches (runtime and driver API) that have a
kernel record. Steps of a recipe (comma-separated, ``name:count``):

- ``prime``: one throwaway torch.profiler session (the engine's ``prime_profiler``);
- ``capture``: capture a CUDA graph of one step;
- ``graph:N``: N sampler-style sessions (CUDA activities only, low-level enable/disable),
  each replaying the graph 4 times;
- ``eager:N``: N such sessions, each running 4 eager steps;
- ``ref:N``: N ``torch.profiler.profile(activities=[CUDA])`` windows of 4 eager steps (the
  truth suite's reference).

A step is a cuBLAS GEMM and aten elementwise ops (runtime API) and two Triton kernels (driver
API, one launched with programmatic dependent launch where Triton has it), as an eager decode
step of ours mixes them. Each recipe runs with the process's default environment and with
``TEARDOWN_CUPTI=0 DISABLE_CUPTI_LAZY_REINIT=1`` (Kineto then keeps CUPTI attached between
sessions instead of finalizing and re-initialising it at each; torch sets this itself only
for CUDA < 12.6 with CUDA graphs).

    python -m bench truth-loss                         # an H200, ~1-2 min
    python -m bench truth-loss --recipes capture,eager:6 --envs default
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import report
from bench.harness.workload import default_device

DESCRIPTION = "which process history makes the profiler lose an eager window's kernel records"

RECIPES = ("eager:6", "prime,eager:6", "capture,eager:6", "prime,capture,eager:6",
           "prime,capture,graph:6,eager:6", "prime,capture,graph:6,ref:3,eager:6",
           "capture,graph:6,eager:6")
ENVS = {"default": {}, "no-teardown": {"TEARDOWN_CUPTI": "0", "DISABLE_CUPTI_LAZY_REINIT": "1"}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--recipes", default=";".join(RECIPES),
                        help="recipes separated by ';' (each: steps separated by ',')")
    parser.add_argument("--envs", default=",".join(ENVS), help=f"of {', '.join(ENVS)}")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child's recipe
    parser.add_argument("--timeout-s", type=float, default=60.0)


def _workload() -> tuple[Any, Any]:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _scale(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + i, mask=i < n)
        tl.store(x_ptr + i, v * 0.5 + 1.0, mask=i < n)

    a = torch.randn(16, 576, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(576, 1536, device="cuda", dtype=torch.bfloat16)
    y = torch.zeros(16, 1536, device="cuda", dtype=torch.bfloat16)
    z = torch.zeros(4096, device="cuda", dtype=torch.float32)
    pdl = {"launch_pdl": True} if torch.cuda.get_device_capability()[0] >= 9 else {}

    def step() -> None:
        torch.matmul(a, w, out=y)
        y.mul_(0.5)
        y.add_(1.0)
        _scale[(4,)](z, z.numel(), BLOCK=1024)
        try:
            _scale[(4,)](z, z.numel(), BLOCK=1024, **pdl)
        except TypeError:  # a Triton without launch_pdl
            _scale[(4,)](z, z.numel(), BLOCK=1024)

    return step, torch


def _count(events: list[dict[str, Any]]) -> dict[str, int]:
    have = {e["args"]["correlation"] for e in events if e["cat"] == "kernel"}
    launches = [e for e in events if e["cat"] == "cuda_runtime" and
                ("LaunchKernel" in e["name"] or "GraphLaunch" in e["name"])]
    kept = sum(1 for e in launches if e["args"]["correlation"] in have)
    drv = [e for e in launches if e["name"].startswith("cuLaunch")]
    return {"launches": len(launches), "kept": kept, "driver_launches": len(drv),
            "driver_kept": sum(1 for e in drv if e["args"]["correlation"] in have),
            "kernels": sum(1 for e in events if e["cat"] == "kernel"),
            "memcpy": sum(1 for e in events if e["cat"] in ("gpu_memcpy", "gpu_memset"))}


def child(recipe: str) -> list[dict[str, Any]]:
    """Run one recipe in this process; a row per profiler session."""
    step, torch = _workload()
    from engine.instruments.kernel_trace import _start
    from engine.instruments.kernel_trace_read import object_events

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    g, rows = None, []
    for part in recipe.split(","):
        name, _, n = part.partition(":")
        count = int(n or 1)
        if name == "prime":
            with torch.profiler.profile():
                torch.cuda._sleep(0)
        elif name == "capture":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            torch.cuda.synchronize()
        elif name in ("graph", "eager"):
            for i in range(count):
                _start(False)
                for _ in range(4):
                    g.replay() if name == "graph" else step()
                torch.cuda._sleep(0)
                torch.cuda.synchronize()
                ev = object_events(torch.autograd._disable_profiler())
                rows.append({"part": name, "session": i, **_count(ev)})
        elif name == "ref":
            from torch.profiler import ProfilerActivity, profile
            for i in range(count):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(4):
                        step()
                    torch.cuda.synchronize()
                ev = object_events(prof.profiler.kineto_results)
                rows.append({"part": name, "session": i, **_count(ev)})
        else:
            raise ValueError(f"unknown recipe step {name!r}: prime, capture, graph:N, "
                             "eager:N, ref:N")
    return rows


def _libs_mention() -> dict[str, list[str]]:
    """Which of Kineto's CUPTI switches torch's libraries name (read, not set)."""
    import torch
    keys = (b"TEARDOWN_CUPTI", b"DISABLE_CUPTI_LAZY_REINIT", b"CUPTI_LAZY_REINIT")
    out = {}
    for f in sorted(Path(torch.__file__).parent.glob("lib/libtorch_c*.so")):
        b = f.read_bytes()
        out[f.name] = [k.decode() for k in keys if k in b]
    return out


def run(args: argparse.Namespace, out: Path) -> dict:
    if args.one is not None:
        print("ROWS " + json.dumps(child(args.one)))
        return {}
    if args.device != "cuda":
        print("truth-loss: no CUDA device: there are no kernel records to lose")
        return {"device": "cpu"}
    results: list[dict[str, Any]] = []
    for env_name in args.envs.split(","):
        for recipe in args.recipes.split(";"):
            env = {**os.environ, **ENVS[env_name]}
            t0 = time.perf_counter()
            try:
                p = subprocess.run([sys.executable, "-m", "bench", "truth-loss", "--one", recipe,
                                    "--out", str(out / "child")], env=env, capture_output=True,
                                   text=True, timeout=args.timeout_s)
                line = [x for x in p.stdout.splitlines() if x.startswith("ROWS ")]
                rows = json.loads(line[-1][5:]) if line else []
                err = None if line else (p.stderr or p.stdout)[-800:]
            except subprocess.TimeoutExpired:
                rows, err = [], f"timed out after {args.timeout_s} s"
            r = {"env": env_name, "recipe": recipe, "rows": rows, "error": err,
                 "s": round(time.perf_counter() - t0, 1)}
            results.append(r)
            tail = [f"{x['part']}{x['session']}:{x['kept']}/{x['launches']}" for x in rows]
            print(f"[{env_name}] {recipe} ({r['s']} s): {' '.join(tail)}"
                  + (f" ERROR {err}" if err else ""), flush=True)
    summary = {"libs": _libs_mention(), "results": results}
    table = []
    for r in results:
        for part in ("graph", "ref", "eager"):
            xs = [x for x in r["rows"] if x["part"] == part]
            if xs:
                table.append([r["env"], r["recipe"], part, len(xs),
                              " ".join(f"{x['kept']}/{x['launches']}" for x in xs),
                              sum(x["memcpy"] for x in xs)])
    report.write_json(out / "truth_loss.json", summary)
    report.write_markdown(out / "truth_loss.md", "Kernel records kept per session, by history", [
        f"torch's libraries name: {summary['libs']}", "",
        report.markdown_table(["env", "recipe", "sessions of", "n", "launches kept / made "
                               "per session", "memcpy/memset records"], table)])
    print(f"libs: {summary['libs']}")
    return summary
