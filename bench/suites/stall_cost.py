"""What judging each step for stalls costs the engine's loop thread, in CPU time per step.

The engine runs engine.instruments.stall_watch.StallWatch.observe on every step record before
it publishes it (with telemetry on): a read of the loop thread's schedstat, the marks still
open, and telemetry.stalls.StallDetector's comparison with its kind's cached median. A
flagged step pays for the attribution too (its lanes against the last steps of its kind).
This times both on made-up async decode steps (eight spans each, the next step's CPU phases
beside them), no model and no GPU:

    python -m bench stall-cost                      # 20,000 steps, 5 runs
    python -m bench stall-cost --steps 50000 --runs 7
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.harness import report

DESCRIPTION = "what judging each step for stalls costs the loop thread, per step (no GPU)"
MS = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20_000, help="steps per run")
    parser.add_argument("--runs", type=int, default=5, help="runs (the median is reported)")
    parser.add_argument("--batch", type=int, default=32, help="requests per step")


def make_steps(n: int, batch: int, stall_every: int = 0) -> list:
    """n async decode steps of about 4 ms (``stall_every``: every that many, one whose post
    phase is 40 times as long)."""
    from telemetry.records import Span, StepRecord

    lanes = (("cpu.schedule", 0.2), ("cpu.prepare", 0.3), ("cpu.launch", 0.1),
             ("cpu.wait", 3.0), ("cpu.post", 0.4))
    steps, t = [], 1_000 * MS
    for i in range(n):
        long = stall_every and i > 100 and i % stall_every == 0
        spans, s = [], t
        for lane, ms in lanes:
            d = int(ms * MS * (40 if long and lane == "cpu.post" else 1))
            spans.append(Span(lane, s, s + d))
            s += d
        spans += [Span("h2d", t + MS, t + MS + 20_000), Span("compute", t + MS, t + 4 * MS),
                  Span("d2h", t + 4 * MS, t + 4 * MS + 20_000)]
        steps.append(StepRecord(step=i, mode="async", slot=i % 2, num_requests=batch,
                                prefill_tokens=0, decode_tokens=batch, spans=spans,
                                running=batch))
        t = s
    return steps


def time_observe(steps: list) -> tuple[float, int]:
    """CPU ns per step of StallWatch.observe over ``steps``, and how many it flagged."""
    from engine.instruments.stall_watch import StallWatch

    watch = StallWatch()
    try:
        observe = watch.observe
        t0 = time.thread_time_ns()  # CPU time: what a loaded machine's waits do not inflate
        for i, rec in enumerate(steps):
            observe(rec, steps[i + 1] if i + 1 < len(steps) else None)
        ns = (time.thread_time_ns() - t0) / len(steps)
        return ns, watch.detector.stalls
    finally:
        watch.close()


def run(args: argparse.Namespace, out: Path) -> dict:
    plain, flagged = [], []
    for _ in range(args.runs):
        ns, n = time_observe(make_steps(args.steps, args.batch))
        assert n == 0, f"{n} steady steps flagged"
        plain.append(ns)
        stall_every = 100
        base, _ = time_observe(make_steps(args.steps, args.batch))
        ns, n = time_observe(make_steps(args.steps, args.batch, stall_every))
        assert n > 0, "no injected stall flagged"
        flagged.append((ns - base) * args.steps / n)  # the extra cost of one flagged step
    summary = {"steps": args.steps, "runs": args.runs, "batch": args.batch,
               "ns_per_step": statistics.median(plain),
               "ns_per_flagged_step_extra": statistics.median(flagged),
               "commit": report.short_commit()}
    table = ["| what | per step |", "|---|---:|",
             f"| every step (StallWatch.observe) | {summary['ns_per_step'] / 1e3:.1f} us |",
             f"| a flagged step, on top (attribution) | "
             f"{summary['ns_per_flagged_step_extra'] / 1e3:.0f} us |"]
    print("\n".join(table), flush=True)
    report.write_json(out / "stall_cost.json", summary)
    (out / "stall_cost.md").write_text("\n".join(table) + "\n")
    return summary
