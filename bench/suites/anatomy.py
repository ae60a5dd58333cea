"""Anatomy of one decode step: its kernels from torch.profiler, grouped by family, against the
step's byte floor, for model_impl transformers vs gapless, at a throughput batch and at batch 1.

The engine runs sync with CUDA graphs (so each step is one graph replay between the slot's H2D
copy and its D2H copy); `batch` requests of `context` prompt tokens are prefilled first, then
`steps` pure decode steps are profiled. Steps are split at each H2D copy. Per family: kernels
per step, kernel time per step, and achieved bandwidth where the bytes are known (GEMMs read the
weights, attention reads the KV cache). Summary per (impl, batch): kernels per step and per
layer, kernel time, gaps inside a step, step span (first kernel to last), the floor
((weight + KV bytes) / 4.22 TB/s), span / floor, and the separate-kernel reference (each read
a lone cold kernel at telemetry.floor's measured bandwidth for its size: what separate kernels
cost, no limit) where a curve for the GPU exists.

    python -m bench anatomy --preset llama-8b --batches 32,1          # on a GPU
    python -m bench anatomy --preset tiny --device cpu --batches 4,1   # CPU smoke (no kernels)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import floor as floors
from bench.harness import report, trace
from bench.harness.fused_args import add_fused_arguments, fused_config
from bench.harness.workload import add_model_arguments, int_list, model_from_args, random_prompts
from telemetry.kernel_family import FAMILIES

DESCRIPTION = ("where one decode step's time goes: kernels by family, span and gaps against "
               "the byte floor (CUDA)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--batches", type=int_list, default=[32, 1],
                        help="comma-separated batch sizes, one row each (default 32,1)")
    parser.add_argument("--context", type=int, default=256, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=20, help="decode steps profiled")
    parser.add_argument("--warmup", type=int, default=5, help="decode steps before profiling")
    parser.add_argument("--impls", default="transformers,gapless",
                        help="comma-separated model_impl values")
    add_fused_arguments(parser)


def run_impl(hf_model: torch.nn.Module, impl: str, batch: int,
             args: argparse.Namespace) -> dict:
    from engine import Engine, EngineConfig, SamplingParams

    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=batch, max_num_batched_tokens=max(2048, batch),
        max_model_len=args.context + args.warmup + args.steps + 32, block_size=16,
        async_batching=False, num_slots=2, cuda_graphs=args.device == "cuda",
        telemetry=False, model_impl=impl, graph_buckets=[batch],  # decode only
        **fused_config(args),
    )
    eng = Engine(cfg, model=hf_model, tokenizer=None, start=False)
    params = SamplingParams(max_tokens=args.warmup + args.steps + 16, temperature=0.0,
                            ignore_eos=True, detokenize=False)
    for prompt in random_prompts(batch, args.context, hf_model.config.vocab_size):
        eng.submit(prompt, params)
    while eng.stats()["generated_tokens"] < batch:  # prefill (and first tokens)
        eng.step()
    for _ in range(args.warmup):
        eng.step()
    res: dict = {"impl": impl, "batch": batch, "settings": eng.settings()}
    if args.device != "cuda":
        t = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        res["wall_ms_per_step"] = (time.perf_counter() - t) * 1e3 / args.steps
        eng.shutdown()
        return res
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    path = Path(tempfile.mkdtemp()) / f"anatomy_{impl}_{batch}.json"
    prof.export_chrome_trace(str(path))
    res.update(trace.analyse(trace.split_steps(trace.device_events(path))))
    res["wall_ms_per_step"] = wall * 1e3 / args.steps
    eng.shutdown()
    return res


def family_table(r: dict, w_bytes: int, kv_bytes: int) -> str:
    total = sum(f["us"] for f in r["families"].values())
    bytes_of = {"gemm": w_bytes, "attention": kv_bytes}
    rows = []
    for name in FAMILIES:
        f = r["families"].get(name)
        if f is None:
            continue
        bw = bytes_of.get(name)
        ok = bool(bw and f["us"])
        rows.append((name, f"{f['count']:.0f}", f"{f['us']:.0f}", f"{f['us'] / total:.0%}",
                     f"{bw / (f['us'] * 1e-6) / 1e9:.0f}" if ok else "",
                     f"{bw / (f['us'] * 1e-6) / floors.COPY_BW:.0%}" if ok else ""))
    title = (f"### {r['impl']} ({r['settings']['model_impl']}), batch {r['batch']}, "
             f"{r['steps']} steps profiled\n\n")
    table = report.markdown_table(["family", "kernels/step", "time/step (us)", "share", "GB/s",
                                   "% of 4.22 TB/s"], rows)
    other = ""
    if r["other_kernels"]:
        other = "\n\nunclassified: " + "; ".join(f"{n} {us / r['steps']:.0f} us"
                                                 for n, us in r["other_kernels"])
    return title + table + other


def summary_row(r: dict, layers: int, floor_us: float, reference_us: float | None) -> list:
    if "families" not in r:  # no kernel timeline off CUDA: wall time only
        return [r["impl"], r["batch"], "", "", "", "", "", f"{floor_us:.0f}", "",
                *(["", ""] if reference_us else []), f"{r['wall_ms_per_step']:.2f}"]
    count = sum(f["count"] for f in r["families"].values())
    total = sum(f["us"] for f in r["families"].values())
    gaps = r["span_us"] - r["kernel_busy_us"]
    reference = ([f"{reference_us:.0f}", f"{r['span_us'] / reference_us:.2f}"]
                 if reference_us else [])
    return [r["impl"], r["batch"], f"{count:.0f}", f"{count / layers:.1f}", f"{total:.0f}",
            f"{gaps:.0f}", f"{r['span_us']:.0f}", f"{floor_us:.0f}",
            f"{r['span_us'] / floor_us:.2f}", *reference, f"{r['wall_ms_per_step']:.2f}"]


def run(args: argparse.Namespace, out: Path) -> dict:
    from engine.model.hf_config import kv_cache_shape

    hf = model_from_args(args)
    layers = kv_cache_shape(hf.config)[0]
    floor = floors.ByteFloor.of(hf)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    ctx = args.context + args.warmup + args.steps // 2
    results, shapes, sections = [], {}, []
    for batch in args.batches:
        reference = floors.separate_kernel_seconds(floor.reads(batch, ctx), gpu)
        shapes[batch] = {"context": ctx, "weight_bytes": floor.weight_bytes,
                         "kv_bytes": floor.kv_bytes(batch, ctx),
                         "floor_us": floor.step_seconds(batch, ctx) * 1e6,
                         "separate_kernel_reference_us": reference * 1e6 if reference else None}
        print(f"{args.preset}: batch {batch}, context ~{ctx}: weights "
              f"{floor.weight_bytes / 1e9:.2f} GB, KV read {floor.kv_bytes(batch, ctx) / 1e9:.3f}"
              f" GB, floor {shapes[batch]['floor_us']:.0f} us "
              f"({floor.bandwidth / 1e12:.2f} TB/s)", flush=True)
        for impl in args.impls.split(","):
            r = run_impl(hf, impl, batch, args)
            results.append(r)
            if "families" in r:
                sections.append(family_table(r, floor.weight_bytes, floor.kv_bytes(batch, ctx)))
            print(f"{impl} batch {batch}: {r['wall_ms_per_step']:.2f} ms/step", flush=True)
    ref_cols = any(s["separate_kernel_reference_us"] for s in shapes.values())
    headers = ["impl", "batch", "kernels/step", "per layer", "kernel time (us)", "gaps (us)",
               "span (us)", "floor (us)", "x floor",
               *(["separate-kernel reference (us)", "x separate-kernel reference"]
                 if ref_cols else []),
               "wall (ms/step, sync, incl. CPU)"]
    rows = [summary_row(r, layers, shapes[r["batch"]]["floor_us"],
                        shapes[r["batch"]]["separate_kernel_reference_us"] if ref_cols else None)
            for r in results]
    summary = report.markdown_table(headers, rows)
    report.emit(out, f"anatomy_{args.preset}", f"Decode-step anatomy, {args.preset}",
                [summary, *sections], {"shapes": shapes, "results": results})
    return {"preset": args.preset, "shapes": shapes,
            "rows": [dict(zip(headers, row, strict=True)) for row in rows]}
