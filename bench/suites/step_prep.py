"""CPU cost of one step's schedule + assemble with N running decode requests (no model).

This is the CPU work the async pipeline must hide under the device's compute time. Prints
median and p90 over many steps.

    python -m bench step-prep [--requests 1 32 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from bench.harness import report
from engine.config import SamplingParams
from engine.core.batch import BufferLayout, HostView, assemble
from engine.core.block_allocator import BlockAllocator, blocks_needed
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scratch import Scratch

DESCRIPTION = "CPU time of one step's schedule + assemble with N running decode requests"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--requests", type=int, nargs="*", default=[1, 32, 256])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)


def measure(num_requests: int, prompt_len: int, block_size: int, steps: int) -> dict[str, float]:
    max_len = prompt_len + steps + 600
    per_req = blocks_needed(max_len, block_size)
    alloc = BlockAllocator(num_requests * per_req + 1)
    sched = Scheduler(alloc, block_size, num_requests, max(2048, num_requests), max_len)
    layout = BufferLayout(max(2048, num_requests), num_requests, per_req)
    host = HostView(np.zeros(layout.size, dtype=np.int32), layout)
    params = SamplingParams(max_tokens=steps + 512, temperature=0.0, ignore_eos=True)
    for i in range(num_requests):
        sched.add(Request(f"r{i}", list(range(1, prompt_len + 1)), params, i, 0))
    # Prefill everyone (budget permitting), then measure pure decode steps.
    while sched.waiting or any(r.num_computed < r.seq_len - 1 for r in sched.running):
        out = sched.schedule()
        assemble(out, host, block_size, Scratch(kv_slot=0))
        _post(out)
    sched_ns, asm_ns = [], []
    for _ in range(steps):
        t0 = time.perf_counter_ns()
        out = sched.schedule()
        t1 = time.perf_counter_ns()
        assemble(out, host, block_size, Scratch(kv_slot=0))
        t2 = time.perf_counter_ns()
        assert len(out.chunks) == num_requests, (len(out.chunks), out.num_decode_tokens)
        assert out.num_decode_tokens == num_requests, (len(out.chunks), out.num_decode_tokens)
        _post(out)
        sched_ns.append(t1 - t0)
        asm_ns.append(t2 - t1)
    total = [a + b for a, b in zip(sched_ns, asm_ns, strict=True)]
    q = lambda xs, p: float(np.percentile(xs, p)) / 1e3  # noqa: E731
    return {
        "schedule_us": statistics.median(sched_ns) / 1e3,
        "assemble_us": statistics.median(asm_ns) / 1e3,
        "total_us": statistics.median(total) / 1e3,
        "total_p90_us": q(total, 90),
    }


def _post(out) -> None:
    for c in out.chunks:
        if c.samples:
            c.request.num_pending -= 1
            c.request.output_token_ids.append(7)


def run(args: argparse.Namespace, out: Path) -> dict:
    rows, results = [], {}
    for n in args.requests:
        r = measure(n, args.prompt_len, args.block_size, args.steps)
        results[str(n)] = r
        rows.append([n, f"{r['schedule_us']:.1f}", f"{r['assemble_us']:.1f}",
                     f"{r['total_us']:.1f}", f"{r['total_p90_us']:.1f}"])
    table = report.markdown_table(["running requests", "schedule (us)", "assemble (us)",
                                   "total median (us)", "total p90 (us)"], rows)
    report.emit(out, "step_prep", "Schedule + assemble, one decode step", [table], results)
    return {"requests": results}
