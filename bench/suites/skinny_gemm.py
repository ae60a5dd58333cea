"""Skinny GEMMs of decode: cuBLAS (torch F.linear) against a split-K Triton kernel, per shape.

Y[M, N] = X[M, K] @ W[N, K]^T for M = 1..256 tokens and the projection shapes of the 8B and
1B models (fused qkv, o, fused gate_up, down, LM head). Decode is weight-bandwidth bound, so
the figure that matters is how close each reads W to the copy bandwidth (4.22 TB/s on the
lent H200). Timing: each GEMM is captured R times in a CUDA graph (no launch overhead),
cycling through enough copies of W (> 256 MB) that L2 (50 MB) cannot serve them.

The Triton kernel is tried over a few tile / split-K configurations per shape and the best
one is reported; the model keeps cuBLAS unless this table says otherwise.

    python -m bench skinny-gemm                 # on the GPU machine, ~1-2 minutes
    python -m bench skinny-gemm --quick         # fewer M values and configs
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from bench.harness import report
from bench.harness.timing import graph_seconds_per_call

DESCRIPTION = ("skinny decode GEMMs: cuBLAS vs a split-K Triton kernel against the copy "
               "bandwidth (CUDA)")

COPY_BW = 4.22e12

SHAPES = {  # name: (N, K)
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096),
    "8b.down": (4096, 14336), "8b.lm_head": (128256, 4096),
    "1b.qkv": (3072, 2048), "1b.o": (2048, 2048), "1b.gate_up": (16384, 2048),
    "1b.down": (2048, 8192),
}


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_os,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    k_span = tl.cdiv(K, SPLIT_K * BK) * BK
    k_lo = pid_k * k_span
    k_hi = tl.minimum(k_lo + k_span, K)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        offs_k = k + tl.arange(0, BK)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
                    mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
        acc += tl.dot(x, tl.trans(w))
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def triton_linear(x: torch.Tensor, w: torch.Tensor, cfg: tuple[int, int, int, int, int]
                  ) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T with (BN, BK, SPLIT_K, num_warps, num_stages); split-K partials
    in fp32, summed by torch (one extra small kernel)."""
    m, k = x.shape
    n = w.shape[0]
    bn, bk, split, warps, stages = cfg
    bm = max(16, min(64, triton.next_power_of_2(m)))
    if split == 1:
        out = torch.empty((1, m, n), dtype=x.dtype, device=x.device)
    else:
        out = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), split)
    _skinny_gemm_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(1),
                              out.stride(0), BM=bm, BN=bn, BK=bk, SPLIT_K=split,
                              num_warps=warps, num_stages=stages)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)




CONFIGS_FULL = list(itertools.product([64, 128], [128, 256], [1, 2, 4, 8], [4], [3, 4]))
CONFIGS_QUICK = [(64, 128, s, 4, 4) for s in (1, 2, 4, 8)] + [(128, 128, 1, 4, 4),
                                                               (128, 256, 2, 4, 3)]



def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ms", default=None, help="comma-separated M values")
    ap.add_argument("--shapes", default=",".join(SHAPES))


def run(args: argparse.Namespace, out: Path) -> dict:
    if not torch.cuda.is_available():
        print("skinny-gemm needs CUDA (no GPU here); nothing measured.")
        return {"measured": False}
    ms = [int(m) for m in args.ms.split(",")] if args.ms else (
        [1, 16, 32, 64, 128, 256] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128, 256])
    configs = CONFIGS_QUICK if args.quick else CONFIGS_FULL
    torch.manual_seed(0)
    dtype = torch.bfloat16
    rows = []
    print("| shape | N x K | M | cuBLAS (us) | cuBLAS % BW | Triton best (us) | Triton % BW | "
          "Triton config (BN,BK,split,warps,stages) | faster |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        w_bytes = n * k * 2
        ncopy = max(2, -(-(256 << 20) // w_bytes))
        copies = [torch.randn(n, k, device="cuda", dtype=dtype) * 0.02 for _ in range(ncopy)]
        reps = max(ncopy, 8)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            t_cublas = graph_seconds_per_call(
                lambda i, x=x, ws=copies: F.linear(x, ws[i]), len(copies), reps)
            ref = F.linear(x, copies[0]).float()
            best = (float("inf"), None)
            for cfg in configs:
                try:
                    got = triton_linear(x, copies[0], cfg).float()
                    err = float((got - ref).norm() / ref.norm())
                    if err > 2e-2:
                        raise AssertionError(f"wrong result (rel err {err:.3g})")
                    t = graph_seconds_per_call(
                        lambda i, x=x, cfg=cfg, ws=copies: triton_linear(x, ws[i], cfg),
                        len(copies), reps)
                except Exception as e:  # a config that does not fit (shared memory) is skipped
                    print(f"  skip {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                best = min(best, (t, cfg), key=lambda b: b[0])
            bw_c = w_bytes / t_cublas / COPY_BW
            bw_t = w_bytes / best[0] / COPY_BW if best[1] else 0.0
            faster = "triton" if best[0] < t_cublas else "cublas"
            rows.append(dict(shape=name, n=n, k=k, m=m, cublas_us=t_cublas * 1e6,
                             triton_us=best[0] * 1e6, triton_cfg=best[1]))
            print(f"| {name} | {n} x {k} | {m} | {t_cublas * 1e6:.1f} | {bw_c:.0%} | "
                  f"{best[0] * 1e6:.1f} | {bw_t:.0%} | {best[1]} | {faster} |", flush=True)
        del copies
        torch.cuda.empty_cache()
    report.write_json(out / "skinny_gemm.json", {"meta": report.meta(),
                                                  "triton": triton.__version__, "rows": rows})
    return {"rows": rows}
