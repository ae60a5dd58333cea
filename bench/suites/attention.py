"""Benchmark of the Triton paged attention kernel against the KV-bandwidth floor.

Owns the numbers behind any claim about `engine.attention.triton_paged`: decode steps of the
shapes in SHAPES (Llama-3.1-8B, Llama-3.2-1B and SmolLM2-135M attention at their batch and
context), each timed at the kernel's default launch (`triton_config.choose_config`), over a
sweep of candidate launches (split-K factor, fewest tiles per split, key tile, warps, pipeline
depth), with programmatic dependent launch off and on, and, given `--before FILE` (an older
`triton_paged.py`, e.g. from `git show`), that module's default in the same process.

Timing is what the engine sees: one CUDA graph replays `copies` back-to-back launches, each on
its own copy of the K/V cache (copies chosen so they together exceed the L2 cache, as a
model's layers do), and a launch costs the median replay time / copies, gaps included.
GB/s counts the K/V bytes one launch must read at least once, against what a device-to-device
copy reaches (COPY_TBPS, docs/benchmarks.md).

    python -m bench attention                        # on a CUDA machine, all shapes
    python -m bench attention --shapes 8b-b32-1280 --quick --before /tmp/old_triton_paged.py
    python -m bench attention --dry --quick          # CPU: the same flow, Triton interpreter

It never changes the kernel's defaults; without CUDA (and without --dry) it says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from bench.harness import report

DESCRIPTION = ("how fast the Triton paged-attention kernel is per shape, and which launch, "
               "against the K/V floor (CUDA)")
COPY_TBPS = 4.22  # device-to-device copy, bytes read + written (docs/benchmarks.md)
COLD_BYTES = 256e6  # K/V copies per graph add up to this (several times a GPU's L2)
MAX_COPIES = 128
BLOCK = 16
DTYPE = torch.bfloat16


class Shape(NamedTuple):
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    context: int


SHAPES = {  # in the order they are swept (a budget that runs out cuts the last ones short)
    "8b-b32-1280": Shape(32, 8, 128, 32, 1280),
    "smollm2-b16-264": Shape(9, 3, 64, 16, 264),
    "8b-b32-264": Shape(32, 8, 128, 32, 264),
    "1b-b1-264": Shape(32, 8, 64, 1, 264),
    "1b-b32-264": Shape(32, 8, 64, 32, 264),
    "8b-b32-8448": Shape(32, 8, 128, 32, 8448),
}
# (block_n, num_warps, num_stages, table_ahead), each a compile, per head_dim, likeliest first
# (a budget that runs out cuts the last); splits and min_tiles are run-time arguments.
TILES = {
    128: [(128, 4, 3, False), (128, 8, 3, False), (64, 4, 3, False), (128, 4, 3, True),
          (64, 4, 3, True), (64, 4, 4, True), (128, 8, 2, False)],
    64: [(128, 4, 3, False), (128, 4, 3, True), (256, 8, 3, True), (64, 4, 3, True),
         (256, 4, 3, True), (128, 8, 3, False), (64, 4, 3, False)],
}
# (num_splits, min_tiles): at 128-key tiles a split takes at least 128 or 256 keys (one tile a
# split wins wherever splitting pays, so min_tiles 2 is sampled once).
SPLITS = [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (4, 2)]


def make_inputs(shape: Shape, copies: int, device: str, seed: int = 0) -> tuple[list, int]:
    """Per copy (q, k_cache, v_cache, table, req, pos): every request decodes its last
    position, blocks shuffled over one cache shared by the copies. Returns (args, bytes)."""
    g = torch.Generator(device=device).manual_seed(seed)
    nb = -(-shape.context // BLOCK)
    n_blocks = nb * shape.batch
    dtype = DTYPE if device == "cuda" else torch.float32
    cache = (copies * n_blocks, BLOCK, shape.kv_heads, shape.head_dim)
    k_cache = torch.randn(cache, device=device, dtype=dtype, generator=g)
    v_cache = torch.randn(cache, device=device, dtype=dtype, generator=g)
    q = torch.randn((shape.batch, shape.heads, shape.head_dim), device=device, dtype=dtype,
                    generator=g)
    req = torch.arange(shape.batch, dtype=torch.int32, device=device)
    pos = torch.full((shape.batch,), shape.context - 1, dtype=torch.int32, device=device)
    args = []
    for c in range(copies):
        perm = torch.randperm(n_blocks, device=device, generator=g).int() + c * n_blocks
        args.append((q, k_cache, v_cache, perm.view(shape.batch, nb), req, pos))
    kv_bytes = shape.batch * shape.context * shape.kv_heads * shape.head_dim * 2 * 2
    return args, kv_bytes


def graph_us(launch: Callable[[int], object], copies: int) -> float:
    """Median microseconds per launch over replays of one graph of `copies` launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up on the capture stream, as the engine
        launch(copies - 1)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for c in range(copies):
            launch(c)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    return sorted(times)[len(times) // 2]


def wall_us(launch: Callable[[int], object], copies: int) -> float:
    """--dry: wall-clock microseconds per launch on the CPU (checks the flow, not speed)."""
    t0 = time.perf_counter()
    for c in range(copies):
        launch(c)
    return (time.perf_counter() - t0) * 1e6 / copies


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("attention_before", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep_shape(name: str, shape: Shape, opts: argparse.Namespace, deadline: float) -> dict:
    from engine.attention.reference import paged_attention as ref_attention
    from engine.attention.triton_config import LaunchConfig

    dry = opts.dry
    device = "cpu" if dry else "cuda"
    if dry:
        shape = shape._replace(context=max(17, shape.context // 64))
    probe_bytes = shape.batch * shape.context * shape.kv_heads * shape.head_dim * 4
    copies = 2 if dry else min(MAX_COPIES, max(1, math.ceil(COLD_BYTES / probe_bytes)))
    args, kv_bytes = make_inputs(shape, copies, device)
    scale = shape.head_dim**-0.5
    out = torch.empty_like(args[0][0])
    ref = ref_attention(*args[-1], scale).float()
    timer = wall_us if dry else graph_us
    rows: list[dict] = []

    def measure(label: str, fn: Callable[..., object], cfg=None, **kw: object) -> dict | None:
        if time.monotonic() > deadline and rows:
            return None
        try:
            us = timer(lambda c: fn(*args[c], scale, out=out, **kw), copies)
            err = ((out.float() - ref).norm() / ref.norm()).item()
        except Exception as exc:  # a launch that does not fit: say so, go on
            print(f"    {label}: failed: {type(exc).__name__}: {str(exc)[:160]}")
            return None
        row = {"label": label, "us": us, "gbps": kv_bytes / (us * 1e-6) / 1e9, "rel_err": err,
               "config": cfg._asdict() if cfg is not None else None}
        row["pct"] = 100 * row["gbps"] / (COPY_TBPS * 1e3)
        rows.append(row)
        return row

    from engine.attention import triton_paged
    from engine.attention.triton_config import pdl_available

    group = shape.heads // shape.kv_heads
    default = triton_paged.resolve_config(
        tokens=shape.batch, kv_heads=shape.kv_heads, group=group, head_dim=shape.head_dim,
        elem_size=2, device=torch.device(device),
    )
    kernel = triton_paged.paged_attention
    measure(f"default {default.label()}", kernel, default, pdl=False)
    if pdl_available(torch.device(device)):
        measure(f"default {default.label()} +pdl", kernel, default, pdl=True)
    if opts.before:
        before = load_module(opts.before)
        measure("before: default", before.paged_attention)
        measure("before: num_splits=1", before.paged_attention, num_splits=1)
    tiles = TILES[shape.head_dim][: 3 if opts.quick else None]
    splits = SPLITS[:3] if opts.quick else SPLITS
    # The default's split count first over every tile (one compile each), then the others
    # (a split count > 1 compiles the merge: another compile per tile).
    splits = sorted(splits, key=lambda sm: (sm[0] != default.num_splits, sm[0] == 1, -sm[0]))
    for s, m in splits:
        for block_n, warps, stages, ahead in tiles:
            cfg = LaunchConfig(s, m, block_n, warps, stages, ahead)
            if cfg == default or (s == 1 and m > 1):
                continue
            measure(cfg.label(), kernel, cfg, pdl=False, **cfg._asdict())
    best = min((r for r in rows if r["config"] is not None), key=lambda r: r["us"])
    if pdl_available(torch.device(device)) and not best["label"].endswith("+pdl"):
        cfg = LaunchConfig(**best["config"])
        measure(f"{cfg.label()} +pdl", kernel, cfg, pdl=True, **cfg._asdict())
    return finish(name, shape, copies, kv_bytes, rows, default)


def finish(name: str, shape: Shape, copies: int, kv_bytes: int, rows: list[dict],
           default) -> dict:
    by_time = sorted(rows, key=lambda r: r["us"])
    shown = by_time[:10] + [r for r in by_time[10:] if "default" in r["label"]
                            or "before" in r["label"]]
    table = report.markdown_table(
        ["launch", "us / launch", "GB/s", "% of 4.22 TB/s", "rel err"],
        [(r["label"], f"{r['us']:.2f}", f"{r['gbps']:.0f}", f"{r['pct']:.1f}",
          f"{r['rel_err']:.1e}") for r in shown],
    )
    head = (f"### {name}: H={shape.heads} KVH={shape.kv_heads} D={shape.head_dim}, batch "
            f"{shape.batch}, context {shape.context}; {kv_bytes / 1e6:.1f} MB of K/V per launch, "
            f"floor {kv_bytes / (COPY_TBPS * 1e6):.1f} us; {copies} cache copies per graph; "
            f"{len(rows)} launches timed, fastest first")
    print(head + "\n\n" + table + "\n", flush=True)
    pick = lambda key: next((r for r in by_time if key(r["label"])), None)  # noqa: E731
    return {
        "shape": shape._asdict(), "copies": copies, "kv_bytes": kv_bytes,
        "default_config": default._asdict(), "rows": by_time,
        "default": pick(lambda s: s.startswith("default") and "+pdl" not in s),
        "default_pdl": pick(lambda s: s.startswith("default") and s.endswith("+pdl")),
        "best": pick(lambda s: not s.startswith("before")),
        "before": pick(lambda s: s == "before: default"),
        "markdown": head + "\n\n" + table,
    }


def bench_prefill(ctx: int, n: int) -> str:
    from engine.attention.triton_paged import paged_attention

    shape = Shape(32, 8, 128, 1, ctx)
    (args,), kv_bytes = make_inputs(shape, 1, "cuda")
    req = torch.zeros(n, dtype=torch.int32, device="cuda")
    pos = torch.arange(ctx - n, ctx, dtype=torch.int32, device="cuda")
    q = torch.randn((n, 32, 128), device="cuda", dtype=DTYPE)
    out = torch.empty_like(q)
    us = graph_us(lambda c: paged_attention(q, *args[1:4], req, pos, 128**-0.5, out=out), 1)
    causal_keys = sum(range(ctx - n + 1, ctx + 1))
    tflops = 4 * 32 * 128 * causal_keys / (us * 1e-6) / 1e12
    return f"chunk of {n} at positions {ctx - n}..{ctx - 1}: {us:.0f} us, {tflops:.0f} TFLOP/s"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default=",".join(SHAPES),
                        help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--quick", action="store_true", help="3 tiles x 3 splits per shape")
    parser.add_argument("--before", default="",
                        help="an older triton_paged.py whose default launch is timed alongside")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="stop sweeping (keep defaults and results) after this many seconds")
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--dry", action="store_true",
                        help="no GPU: tiny contexts on the CPU, Triton interpreter, fp32")


def run(opts: argparse.Namespace, out: Path) -> dict:
    if not opts.dry and not torch.cuda.is_available():
        print("attention needs CUDA (no GPU here; --dry runs the flow on the CPU); nothing "
              "measured.")
        return {"measured": False}
    names = [n.strip() for n in opts.shapes.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        raise SystemExit(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    if opts.dry:
        # The Triton interpreter reads the variable when the kernel module is imported.
        if "engine.attention.triton_paged" in sys.modules and not os.environ.get(
                "TRITON_INTERPRET"):
            raise SystemExit("--dry needs TRITON_INTERPRET=1 before the kernel is imported")
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        import triton

        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"triton {triton.__version__}, bf16, block {BLOCK}")
    start = time.monotonic()
    results = {}
    for i, name in enumerate(names):
        # Each shape gets an equal share of what is left of the budget.
        share = (opts.budget_s - (time.monotonic() - start)) / (len(names) - i)
        results[name] = sweep_shape(name, SHAPES[name], opts, time.monotonic() + share)
    summary = report.markdown_table(
        ["shape", "default launch", "us", "% of 4.22 TB/s", "default +PDL us", "best launch",
         "best us", "best %", "before us"],
        [(n, r["default"]["label"].removeprefix("default ") if r["default"] else "-",
          fmt(r["default"], "us"), fmt(r["default"], "pct"),
          fmt(r["default_pdl"], "us"), r["best"]["label"] if r["best"] else "-",
          fmt(r["best"], "us"), fmt(r["best"], "pct"), fmt(r["before"], "us"))
         for n, r in results.items()],
    )
    sections = ["## Chosen default vs best, per shape\n\n" + summary]
    sections += [r.pop("markdown") for r in results.values()]
    if not opts.dry and not opts.no_prefill:
        sections.append("## Prefill, one request, H=32 KVH=8 D=128 (default launch)\n\n- "
                        + "\n- ".join(bench_prefill(c, 2048) for c in (2048, 8448)))
    report.emit(out, "attention", "Triton paged attention: launch sweep", sections, results)
    return {"measured": not opts.dry, "shapes": {
        n: {k: r[k] and {f: r[k][f] for f in ("label", "us", "pct")}
            for k in ("default", "default_pdl", "best", "before")}
        for n, r in results.items()}}


def fmt(row: dict | None, key: str) -> str:
    return "-" if row is None else f"{row[key]:.1f}" if key == "pct" else f"{row[key]:.2f}"
