"""Benchmark of the Triton paged attention kernel against the KV-bandwidth floor.

Owns the numbers behind any claim about `engine.attention.triton_paged`: decode at batch 32 with
contexts 1280 and 8448 (Llama-3.1-8B attention shape: H=32, KVH=8, D=128, bf16, block 16),
over a sweep of split-K factors and key tile sizes, and a 2048-token prefill chunk (fresh,
and at the end of an 8448-token context). Times are medians of triton.testing.do_bench
(eager launches) and of do_bench_cudagraph (one CUDA-graph replay, as the engine runs it).
GB/s uses the better of the two and counts the K/V bytes the op must read at least once,
against the 4.22 TB/s a device-to-device copy reaches on the H200.

    python -m bench attention            # on a CUDA machine
    python -m bench attention --quick    # fewer configurations

It never changes the kernel's defaults; on a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch

DESCRIPTION = ("Triton paged attention (decode split-K sweep, prefill) against the KV-bandwidth "
               "floor (CUDA)")
COPY_TBPS = 4.22  # H200 device-to-device copy, bytes read + written, measured (docs/design.md 6)
H, KVH, D, BLOCK = 32, 8, 128, 16
DTYPE = torch.bfloat16


def make_inputs(
    ctxs: list[int], n_queries: list[int], seed: int = 0
) -> tuple[tuple[torch.Tensor, ...], int]:
    """Inputs of one step (request r: the last n_queries[r] positions of a ctxs[r] context),
    blocks shuffled over the cache. Returns (args, kv bytes read once)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    blocks_per = [-(-c // BLOCK) for c in ctxs]
    n_blocks = sum(blocks_per)
    k_cache = torch.randn((n_blocks, BLOCK, KVH, D), device="cuda", dtype=DTYPE, generator=g)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(n_blocks, device="cuda", generator=g).int()
    table = torch.zeros((len(ctxs), max(blocks_per)), dtype=torch.int32, device="cuda")
    start = 0
    for r, nb in enumerate(blocks_per):
        table[r, :nb] = perm[start : start + nb]
        start += nb
    req = torch.cat([torch.full((n,), r) for r, n in enumerate(n_queries)])
    pos = torch.cat([torch.arange(c - n, c) for c, n in zip(ctxs, n_queries, strict=True)])
    q = torch.randn((req.numel(), H, D), device="cuda", dtype=DTYPE, generator=g)
    args = (q, k_cache, v_cache, table, req.int().cuda(), pos.int().cuda())
    kv_bytes = sum(ctxs) * KVH * D * 2 * k_cache.element_size()
    return args, kv_bytes


def time_ms(fn: Callable[[], object]) -> tuple[float, float]:
    """(eager median ms, CUDA-graph replay median ms)."""
    import triton.testing

    fn()  # compile outside any capture
    torch.cuda.synchronize()
    eager = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    try:
        graph = triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
    except Exception as exc:  # report, do not hide, a capture failure
        print(f"    cuda graph timing failed: {exc!r}")
        graph = float("nan")
    return eager, graph


def bench_decode(ctx: int, quick: bool) -> None:
    from engine.attention.reference import paged_attention as ref_attention
    from engine.attention.triton_paged import default_num_splits
    from engine.attention.triton_paged import paged_attention as triton_attention

    args, kv_bytes = make_inputs([ctx] * 32, [1] * 32)
    out = torch.empty_like(args[0])
    auto = default_num_splits(32, KVH, args[0].device)
    ref = ref_attention(*args, D**-0.5)
    print(f"\ndecode, batch 32, context {ctx}: {kv_bytes / 1e6:.1f} MB of K/V "
          f"(floor {kv_bytes / (COPY_TBPS * 1e12) * 1e6:.1f} us at {COPY_TBPS} TB/s); "
          f"default num_splits={auto}")
    print(f"  {'num_splits':>10} {'block_n':>7} {'stages':>6} {'eager us':>9} {'graph us':>9} "
          f"{'GB/s':>7} {'% floor':>7} {'rel err':>8}")
    # Split-K sweep at the default tile, then tile sizes and pipeline depth at the default
    # split count: (num_splits, block_n, num_stages).
    configs = [(s, 64, 3) for s in sorted({1, 2, 3, 4, 6, 8, 16, auto})]
    configs += [(auto, 32, 3), (auto, 128, 3), (auto, 64, 2)]
    if quick:
        configs = [(1, 64, 3), (auto, 64, 3)]
    for splits, block_n, stages in configs:
        def fn(splits: int = splits, block_n: int = block_n, stages: int = stages) -> object:
            return triton_attention(
                *args, D**-0.5, out=out, num_splits=splits, block_n=block_n, num_stages=stages
            )
        eager, graph = time_ms(fn)
        fn()
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        best = min(eager, graph)
        gbps = kv_bytes / (best * 1e-3) / 1e9
        mark = " <- default" if (splits, block_n, stages) == (auto, 64, 3) else ""
        print(f"  {splits:>10} {block_n:>7} {stages:>6} {eager * 1e3:>9.1f} {graph * 1e3:>9.1f} "
              f"{gbps:>7.0f} {100 * gbps / (COPY_TBPS * 1e3):>6.1f}% {err:>8.1e}{mark}")
    ref_eager = triton_bench_once(lambda: ref_attention(*args, D**-0.5))
    print(f"  torch reference (eager, loops over requests): {ref_eager * 1e3:.0f} us")


def triton_bench_once(fn: Callable[[], object]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=3, rep=50, return_mode="median")


def bench_prefill(ctx: int, n: int) -> None:
    from engine.attention.triton_paged import paged_attention

    args, kv_bytes = make_inputs([ctx], [n])
    out = torch.empty_like(args[0])
    eager, graph = time_ms(lambda: paged_attention(*args, D**-0.5, out=out))
    best = min(eager, graph)
    causal_keys = sum(range(ctx - n + 1, ctx + 1))  # keys seen, summed over the chunk
    tflops = 4 * H * D * causal_keys / (best * 1e-3) / 1e12
    gbps = kv_bytes / (best * 1e-3) / 1e9
    print(f"  chunk of {n} at positions {ctx - n}..{ctx - 1}: eager {eager * 1e3:.0f} us, "
          f"graph {graph * 1e3:.0f} us, {tflops:.0f} TFLOP/s (causal), "
          f"{gbps:.0f} GB/s of K/V read once")



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="sweep fewer configurations")


def run(opts: argparse.Namespace, out: Path) -> dict:
    if not torch.cuda.is_available():
        print("attention needs CUDA (no GPU here); nothing measured.")
        return {"measured": False}
    import triton

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; H={H} KVH={KVH} D={D} {DTYPE} block {BLOCK}")
    for ctx in (1280, 8448):
        bench_decode(ctx, opts.quick)
    print(f"\nprefill, one request, H={H} KVH={KVH} D={D}:")
    bench_prefill(2048, 2048)
    bench_prefill(8448, 2048)
    return {"measured": True, "tables": "stdout.txt"}
