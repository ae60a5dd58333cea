"""The CPU's work per step, phase by phase, with the device work stubbed out.

Drives the real StepLoop for pure decode steps through bench.harness.inline_loop (inline
streams, a runner that "samples" the next token of a fixed text). What is left is the host's
work per step, the work that has to fit under the device's step time for async mode to keep
the GPU busy.

Per batch size and tokenizer it runs variants, so each cost shows as a difference:

    ids      : detokenize off, telemetry off     (schedule, assemble, launch, append, stops)
    +telem   : telemetry on                      (+ spans, step record, request events, bus)
    +detok   : + detokenize, text deltas to the request handles
    +stop    : + two stop strings per request that never match (the search runs every token)

It prints, per variant, the median CPU time of one StepLoop.step() on the loop thread
(time.thread_time_ns: the figure to compare, as it hardly moves when other jobs load the
machine), its median and p90 wall time, and the median wall time of each CPU lane the loop
records (schedule, prepare, launch, wait, post; wait is ~0 with inline streams), launch less
the stand-in device work ("bookkeeping"), and the loop's time outside its lanes ("other").
`--gc` instead runs many requests to the end and reports the garbage collector's pauses on
the loop thread (gc.callbacks), with and without the loop's GC settings.

    python -m bench step-cpu [--batch 1 16 64] [--steps 400] [--gc]
    python -m bench ab step-cpu --trees BEFORE,AFTER --rounds 3 -- --batch 16   # before/after
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.harness import report
from bench.harness.inline_loop import TOKENIZERS, build_loop, text_ids
from engine.config import SamplingParams
from engine.core.request import Request
from engine.handles import RequestHandle

DESCRIPTION = ("the host's CPU work per decode step, lane by lane, device stubbed out (--gc: "
               "collector pauses)")
LANES = ("cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.wait", "cpu.post")
DEVICE_WORK = ("h2d", "compute", "d2h")  # stand-in device work, run inline in cpu.launch
VARIANTS = {  # name: (telemetry, detokenize, stop strings)
    "ids": (False, False, None),
    "+telem": (True, False, None),
    "+detok": (True, True, None),
    "+stop": (True, True, ["<never-1>", "\n\n\n\n\n\n"]),
}


def measure(tokenizer, batch: int, variant: str, steps: int,
            device: str = "inline") -> dict[str, float]:
    telemetry, detokenize, stop = VARIANTS[variant]
    loop, sink = build_loop(tokenizer, batch, telemetry, detokenize, stop, steps,
                            device=device)
    while (
        any(r.num_computed < r.prompt_len for r in loop.scheduler.running) or loop.scheduler.waiting
    ):  # prefill everyone
        loop.step()
    for _ in range(8):  # and settle into decode
        loop.step()
    reader = loop.bus.reader(from_now=True) if loop.bus is not None else None
    walls, cpus = [], []
    for _ in range(steps):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        loop.step()
        walls.append(time.perf_counter_ns() - t0)
        cpus.append(time.thread_time_ns() - c0)
    lanes: dict[str, list[int]] = {lane: [] for lane in LANES + ("bookkeeping", "other")}
    if reader is not None:
        recs = reader.steps()
        for rec in recs:
            assert rec.decode_tokens == batch and rec.prefill_tokens == 0, rec
            d = {sp.lane: sp.end_ns - sp.start_ns for sp in rec.spans}
            for lane in LANES:
                lanes[lane].append(d[lane])
            # launch less the stand-in device work run inline: the pipeline's own work
            inline = sum(d[k] for k in DEVICE_WORK) if device == "inline" else 0
            lanes["bookkeeping"].append(d["cpu.launch"] - inline)
        # What no lane covers: the step record, reading op spans, publishing (the loop's
        # time outside its spans): step wall less the lanes of the record published in it.
        for wall, rec in zip(walls, recs, strict=False):
            d = {sp.lane: sp.end_ns - sp.start_ns for sp in rec.spans}
            lanes["other"].append(wall - sum(d[lane] for lane in LANES))
    assert all(len(r.output_token_ids) > steps for r in loop.scheduler.running)
    loop.end_all("abort")
    loop.close()
    out = {
        "cpu_us": statistics.median(cpus) / 1e3,
        "step_us": statistics.median(walls) / 1e3,
        "step_p90_us": float(np.percentile(walls, 90)) / 1e3,
    }
    for lane, xs in lanes.items():
        out[lane] = statistics.median(xs) / 1e3 if xs else float("nan")
    return out


def gc_run(
    tokenizer, requests: int, new_tokens: int, batch: int, freeze: bool, threshold0: int | None
) -> dict[str, float]:
    """Many requests, each run to its end, through the loop (telemetry on, detokenized);
    returns the loop thread's GC pauses. The caller has loaded a real model first, so the
    heap a full collection walks is an engine process's (torch, transformers, the model)."""
    # (generation, wall ns, loop-thread CPU ns): on a loaded VM the wall time of a pause
    # also counts time the thread was descheduled; the CPU time is the collection's own.
    pauses: list[tuple[int, int, int]] = []
    started: list[tuple[int, int]] = []

    def cb(phase: str, info: dict) -> None:
        if phase == "start":
            started.append((time.perf_counter_ns(), time.thread_time_ns()))
        elif started:
            w, c = started.pop()
            pauses.append(
                (info["generation"], time.perf_counter_ns() - w, time.thread_time_ns() - c)
            )

    loop, sink = build_loop(tokenizer, batch, True, True, None, new_tokens)
    loop.end_all("abort")
    eos = {tokenizer.eos_token_id}
    ids = text_ids(tokenizer, eos)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i in range(requests):
        prompt = [int(x) for x in ids[(i * 7) % 50 : (i * 7) % 50 + 128]]
        req = Request(f"g{i}", prompt, params, i, time.perf_counter_ns())
        sink.open[req.request_id] = (req, RequestHandle(req.request_id))
        loop.add(req)
    if freeze:  # what the engine does once its model is loaded
        from engine.step import heap

        heap.settle()
    if threshold0 is not None:
        gc.set_threshold(threshold0, *gc.get_threshold()[1:])
    tracked = len(gc.get_objects())
    gc.callbacks.append(cb)
    t0 = time.perf_counter()
    steps = 0
    try:
        while loop.step():
            steps += 1
    finally:
        gc.callbacks.remove(cb)
    wall = time.perf_counter() - t0
    loop.close()
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # (else extension modules report "leaks" at exit)
    by_gen = {g: [ns for gg, ns, _ in pauses if gg == g] for g in (0, 1, 2)}
    cpu_gen = {g: [ns for gg, _, ns in pauses if gg == g] for g in (0, 1, 2)}
    out: dict[str, float] = {"steps": steps, "wall_s": wall, "tracked": tracked, "frozen": frozen}
    for g, xs in by_gen.items():
        out[f"gen{g}_n"] = len(xs)
        out[f"gen{g}_max_ms"] = max(xs) / 1e6 if xs else 0.0
        out[f"gen{g}_total_ms"] = sum(xs) / 1e6
        out[f"gen{g}_cpu_max_ms"] = max(cpu_gen[g]) / 1e6 if cpu_gen[g] else 0.0
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--tokenizer", nargs="*", default=list(TOKENIZERS), choices=list(TOKENIZERS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2, help="runs per cell; the best is shown")
    ap.add_argument("--gc", action="store_true", help="measure GC pauses instead")
    ap.add_argument("--gc-requests", type=int, default=2000)
    ap.add_argument("--gc-new", type=int, default=256)
    ap.add_argument("--gc-batch", type=int, default=64)
    ap.add_argument("--gc-freeze", action="store_true", help="gc.collect() + gc.freeze() first")
    ap.add_argument("--gc-threshold0", type=int, default=None)
    ap.add_argument("--device", choices=["inline", "cuda"], default="inline",
                    help="inline: stand-in streams run in the loop thread (no device); cuda: "
                    "the engine's CUDA streams with a gather as the device work")


def run(args: argparse.Namespace, out: Path) -> dict:
    from transformers import AutoTokenizer

    if args.device == "cuda" and args.gc:
        raise SystemExit("--gc runs on the inline streams; leave out --device cuda")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda needs a CUDA GPU; this machine has none "
                             "(use --device inline)")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  python {sys.version.split()[0]}  "
          f"gc thresholds {gc.get_threshold()}")
    if args.gc:
        from transformers import AutoModelForCausalLM

        path = TOKENIZERS[args.tokenizer[0]]
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)  # noqa: F841 (held: the heap)
        r = gc_run(tok, args.gc_requests, args.gc_new, args.gc_batch, args.gc_freeze,
                   args.gc_threshold0)
        print(f"model {path.name}; {args.gc_requests} requests x {args.gc_new} new tokens, "
              f"batch {args.gc_batch}; freeze={args.gc_freeze} threshold0={args.gc_threshold0}"
              f"; objects tracked at start {int(r['tracked'])}, frozen {int(r['frozen'])}")
        print("collections: count / longest wall ms (longest CPU ms) / total wall ms")
        cells = [f"{int(r[f'gen{g}_n'])} / {r[f'gen{g}_max_ms']:.2f} "
                 f"({r[f'gen{g}_cpu_max_ms']:.2f}) / {r[f'gen{g}_total_ms']:.1f}"
                 for g in (0, 1, 2)]
        print(report.markdown_table(["steps", "wall (s)", "gen0", "gen1", "gen2"],
                                    [[int(r["steps"]), f"{r['wall_s']:.2f}", *cells]], "rrlll"))
        return {"gc": r}
    print("| tokenizer | batch | variant | step CPU time (us) | step wall median (us) | "
          "step wall p90 (us) | schedule | prepare | launch (bookkeeping) | wait | post | "
          "other |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cells: dict[str, dict] = {}
    for name in args.tokenizer:
        tok = AutoTokenizer.from_pretrained(TOKENIZERS[name])
        for batch in args.batch:
            for variant in args.variants:
                runs = [measure(tok, batch, variant, args.steps, args.device)
                        for _ in range(args.repeats)]
                r = min(runs, key=lambda x: x["cpu_us"])
                cells[f"{name} b{batch} {variant}"] = r
                lanes = (f"{r['cpu.schedule']:.1f} | {r['cpu.prepare']:.1f} | "
                         f"{r['cpu.launch']:.1f} ({r['bookkeeping']:.1f}) | {r['cpu.wait']:.1f}"
                         f" | {r['cpu.post']:.1f} | {r['other']:.1f}")
                print(f"| {name} | {batch} | {variant} | {r['cpu_us']:.1f} | "
                      f"{r['step_us']:.1f} | {r['step_p90_us']:.1f} | {lanes} |", flush=True)
    report.write_json(out / "step_cpu.json", {"meta": report.meta(), "cells": cells})
    return {"cells": cells}
