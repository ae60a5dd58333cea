"""The fused decode GEMMs against cuBLAS, per shape: the table `decode_layer: auto` reads.

For each decode GEMM of the fused layer (engine/model/llama.py, `decode_layer: fused`) of
SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B at M in {1, 16, 32}, this times
- cuBLAS and the separate kernels the fused one replaces, as the present path runs them:
  qkv: add+RMSNorm then F.linear; gate_up: add+RMSNorm, F.linear, SiLU*up; o and down:
  F.linear alone (their residual add rides in the next add+RMSNorm, which runs anyway);
- the fused Triton kernel (engine/model/fused_gemm.py) with every tile configuration of
  CONFIGS, then the best one again launched with programmatic dependent launch (PDL).
- op qkv_rope (kind norm_rope): the qkv GEMM with rotary and the KV-cache write in its
  epilogue (engine/model/fused_rope.py, ROPE_CONFIGS) against both ways the layer runs it
  otherwise: cuBLAS + add+RMSNorm + rope_and_cache, and ("split") the fused norm-prologue qkv
  (its table configuration, PDL as the sweep's) + rope_and_cache.
Timing: R calls captured in one CUDA graph (launch overhead excluded, as in a decode step),
cycling through weight copies of >= 128 MB in all so that L2 (50 MB) cannot serve them; the
figure is graph time / R. Kernels compile first in parallel worker processes (Triton's disk
cache), so the sweep's time is spent timing.

Writes fused_sweep.json (every row), fused_table.json (the per-shape table, the format of
engine/model/gemm_table.json; config key gemm_table, or --gemm-table of the suites that build
engines, runs the model with it) and fused_sweep.md.

    python -m bench fused-sweep                      # one GPU
    python -m bench fused-sweep --models smollm2-135m --ms 16
    python -m bench fused-sweep --ops qkv_rope --base-table engine/model/gemm_table.json
    python -m bench fused-sweep --device cpu         # dry run: the torch twins, one tiny shape
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.harness import report
from bench.harness.timing import graph_seconds_per_call

DESCRIPTION = ("which decode GEMMs the fused Triton kernel wins per shape; writes the table "
               "decode_layer auto reads (CUDA)")

COPY_BW = 4.22e12
EPS = 1e-5
MODELS = {  # name: (hidden, q+k+v heads * head_dim, intermediate)
    "smollm2-135m": (576, (9 + 2 * 3) * 64, 1536),
    "llama-1b": (2048, (32 + 2 * 8) * 64, 8192),
    "llama-8b": (4096, (32 + 2 * 8) * 128, 14336),
}
HEADS = {"smollm2-135m": (9, 3, 64), "llama-1b": (32, 8, 64), "llama-8b": (32, 8, 128),
         "dry": (2, 1, 24)}  # (q heads, kv heads, head_dim)
# (BLOCK_N, BLOCK_K, num_warps, num_stages): small N tiles give every SM a program at
# N = 576..4096; long K tiles keep the loop short and the loads in flight.
CONFIGS = [
    (16, 128, 4, 3), (16, 256, 4, 3), (16, 256, 4, 4), (16, 512, 4, 2), (16, 256, 2, 4),
    (32, 128, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (32, 256, 8, 3),
    (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4), (64, 256, 8, 3),
    (128, 64, 4, 4), (128, 128, 8, 3),
]
QUICK = [(16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (128, 64, 4, 4)]
# The rotary epilogue: BLOCK_N counts output columns, two per rotary pair (16: one interleaved
# accumulator; wider: one per half).
ROPE_CONFIGS = [
    (16, 256, 4, 3), (16, 512, 4, 2), (16, 256, 2, 4),
    (32, 128, 4, 3), (32, 256, 4, 3), (32, 256, 2, 4),
    (64, 128, 4, 3), (64, 128, 4, 4), (64, 256, 4, 3), (64, 256, 8, 3), (128, 64, 4, 4),
]
ROPE_QUICK = [(16, 256, 4, 3), (32, 256, 4, 3), (64, 128, 4, 4)]


def gemms(model: str) -> list[tuple[str, str, int, int]]:
    """(op, kind, N, K) of one layer; N of norm_pair is the intermediate size."""
    h, qkv, inter = MODELS[model]
    return [("qkv", "norm", qkv, h), ("o", "residual", h, h),
            ("gate_up", "norm_pair", inter, h), ("down", "residual", h, inter),
            ("qkv_rope", "norm_rope", qkv, h)]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ms", default="1,16,32", help="comma-separated batch sizes M")
    ap.add_argument("--ops", default="qkv,o,gate_up,down,qkv_rope",
                    help="which GEMMs of the layer (qkv_rope: qkv + rotary + KV write)")
    ap.add_argument("--base-table", default=None,
                    help="a table (e.g. engine/model/gemm_table.json) whose entries this run's "
                         "overwrite in fused_table.json (a partial re-sweep)")
    ap.add_argument("--quick", action="store_true", help=f"only {len(QUICK)} configurations")
    ap.add_argument("--no-pdl", action="store_true", help="skip the PDL timing")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="stop starting new shapes after this many seconds (table so far kept)")
    ap.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes compiling the kernels first (0: compile while timing)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")


def time_wall(fn: Callable[[int], object], n_copies: int, reps: int) -> float:
    """The dry run's timer (CPU): wall seconds per call."""
    t0 = time.perf_counter()
    for i in range(reps):
        fn(i % n_copies)
    return (time.perf_counter() - t0) / reps


class Operands:
    """One shape's inputs and >= 128 MB of weight copies (L2 flushed by cycling them)."""

    def __init__(self, kind: str, n: int, k: int, m: int, device: str, dtype: torch.dtype,
                 min_bytes: int) -> None:
        rows = 2 * n if kind == "norm_pair" else n
        self.w_bytes = rows * k * dtype.itemsize
        self.n_copies = max(2, -(-min_bytes // self.w_bytes))
        g = torch.Generator(device=device).manual_seed(n * 31 + k + m)
        self.w = [torch.randn(rows, k, device=device, dtype=dtype, generator=g) * k ** -0.5
                  for _ in range(self.n_copies)]
        self.x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
        self.nw = 1 + 0.1 * torch.randn(k, device=device, dtype=dtype, generator=g)
        self.res_in = torch.randn(m, k, device=device, dtype=dtype, generator=g)
        self.res_out = torch.randn(m, n, device=device, dtype=dtype, generator=g)
        self.kind = kind

    def cublas(self, i: int) -> torch.Tensor:
        """The present path's kernels for this GEMM (see the module docstring)."""
        from engine.model.fused_ops import add_rms_norm, silu_and_mul

        if self.kind == "residual":
            return F.linear(self.x, self.w[i])
        h, _ = add_rms_norm(self.x, self.res_in, self.nw, EPS)  # res_in grows: harmless
        y = F.linear(h, self.w[i])
        return silu_and_mul(y) if self.kind == "norm_pair" else y

    def fused(self, i: int, cfg, pdl: bool = False) -> torch.Tensor:
        from engine.model.fused_gemm import fused_linear

        if self.kind == "residual":
            return fused_linear(self.x, self.w[i], residual=self.res_out, config=cfg, pdl=pdl)
        return fused_linear(self.x, self.w[i], norm=self.nw, eps=EPS,
                            pair=self.kind == "norm_pair", config=cfg, pdl=pdl)

    def reference(self) -> torch.Tensor:
        from engine.model.fused_gemm import fused_linear_torch

        if self.kind == "residual":
            return fused_linear_torch(self.x, self.w[0], residual=self.res_out)
        return fused_linear_torch(self.x, self.w[0], norm=self.nw, eps=EPS,
                                  pair=self.kind == "norm_pair")


class RopeOperands(Operands):
    """The qkv GEMM with rotary and the KV write: cos/sin, positions, slots and caches as a
    decode step has them (one cache block of 16 per row)."""

    def __init__(self, n: int, k: int, m: int, device: str, dtype: torch.dtype,
                 min_bytes: int, heads: tuple[int, int, int], split_cfg=None) -> None:
        super().__init__("norm_rope", n, k, m, device, dtype, min_bytes)
        self.heads, kvh, d = heads
        g = torch.Generator(device=device).manual_seed(n + m)
        self.cos_sin = torch.randn(4096, 2, d // 2, device=device, dtype=dtype, generator=g)
        self.pos = torch.randint(0, 4096, (m,), device=device, dtype=torch.int32, generator=g)
        self.slots = torch.arange(m, device=device, dtype=torch.int64) * 16 + 5
        self.caches = [torch.zeros(m, 16, kvh, d, device=device, dtype=dtype) for _ in "kv"]
        self.split_cfg = split_cfg

    def _rope(self, qkv: torch.Tensor) -> torch.Tensor:
        from engine.model.fused_ops import rope_and_cache

        return rope_and_cache(qkv, self.cos_sin, self.pos, self.slots, *self.caches,
                              self.heads)

    def cublas(self, i: int) -> torch.Tensor:
        return self._rope(super().cublas(i))

    def split(self, i: int, pdl: bool = False) -> torch.Tensor:
        from engine.model.fused_gemm import fused_linear

        return self._rope(fused_linear(self.x, self.w[i], norm=self.nw, eps=EPS,
                                       config=self.split_cfg, pdl=pdl))

    def _kw(self) -> dict:
        return dict(norm=self.nw, eps=EPS, cos_sin=self.cos_sin, positions=self.pos,
                    slot_mapping=self.slots, k_cache=self.caches[0], v_cache=self.caches[1],
                    num_heads=self.heads)

    def fused(self, i: int, cfg, pdl: bool = False) -> torch.Tensor:
        from engine.model.fused_rope import fused_qkv_rope

        return fused_qkv_rope(self.x, None, self.w[i], None, **self._kw(), config=cfg,
                              pdl=pdl)[0]

    def reference(self) -> torch.Tensor:
        from engine.model.fused_rope import fused_qkv_rope_torch

        return fused_qkv_rope_torch(self.x, None, self.w[0], None, **self._kw())[0]


def operands(kind: str, n: int, k: int, m: int, device: str, dtype: torch.dtype,
             min_bytes: int, heads=None, split_cfg=None) -> Operands:
    if kind == "norm_rope":
        return RopeOperands(n, k, m, device, dtype, min_bytes, heads, split_cfg)
    return Operands(kind, n, k, m, device, dtype, min_bytes)


def _warm_one(job: tuple) -> str | None:
    """Compile one (kind, m, config, pdl[, heads]) variant into Triton's disk cache (worker
    process)."""
    kind, m, config, pdl, *heads = job
    try:
        from engine.model.gemm_table import GemmConfig

        # N, K multiples of 16 like every swept shape, K >= 512: the same compiled variant
        # (norm_rope: the model's heads; head_dim is a compile-time constant)
        n = (heads[0][0] + 2 * heads[0][1]) * heads[0][2] if heads else 64
        ops = operands(kind, n, 1024, m, "cuda", torch.bfloat16, 0, *heads)
        ops.fused(0, GemmConfig(*config), pdl)
        torch.cuda.synchronize()
    except Exception as e:  # the timing loop reports it again and skips the config
        return f"{job}: {type(e).__name__}: {str(e)[:100]}"
    return None


def warm(jobs: list[tuple], workers: int) -> None:
    if workers <= 0 or not jobs:
        return
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        errors = [e for e in pool.map(_warm_one, jobs, chunksize=1) if e]
    print(f"compiled {len(jobs)} kernel variants in {time.perf_counter() - t0:.0f} s "
          f"({workers} processes, {len(errors)} failed)", flush=True)


def split_config(entries: dict, n: int, k: int, m: int):
    """The norm-prologue qkv's configuration the split baseline of qkv_rope runs: the table's
    (this run's or the base table's), else the heuristic."""
    from engine.model.gemm_table import GemmConfig, heuristic_config, m_bucket, shape_key

    bucket = m_bucket(m)
    entry = entries.get(shape_key("norm", n, k, bucket)) if bucket else None
    return GemmConfig(*entry["config"]) if entry else heuristic_config(n, k)


def measure(model: str, op: str, kind: str, n: int, k: int, m: int, configs: list[tuple], *,
            dry: bool, pdl: bool, min_bytes: int, entries: dict | None = None
            ) -> tuple[dict, dict | None]:
    """One shape: cuBLAS + ops, every configuration, the best one with PDL; (row, entry).
    norm_rope also times the split baseline (the fused qkv + rope_and_cache)."""
    from engine.model.gemm_table import GemmConfig

    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    timer = time_wall if dry else graph_seconds_per_call
    rope = kind == "norm_rope"
    ops = operands(kind, n, k, m, device, dtype, min_bytes, HEADS.get(model),
                   split_config(entries or {}, n, k, m) if rope else None)
    reps = 2 if dry else max(ops.n_copies, 16)
    ref = ops.reference().float()
    t_cublas = timer(ops.cublas, ops.n_copies, reps)
    t_split = None
    if rope:  # the fused qkv launched as the model would with PDL on
        t_split = timer(lambda i: ops.split(i, pdl and not dry), ops.n_copies, reps)
    times = {}
    for c in configs:
        cfg = GemmConfig(*c)
        try:
            got = ops.fused(0, cfg).float()
            err = float((got - ref).norm() / ref.norm())
            if err > 2e-2:
                raise AssertionError(f"wrong result (rel err {err:.3g})")
            times[c] = timer(lambda i, cfg=cfg: ops.fused(i, cfg), ops.n_copies, reps)
        except Exception as e:  # a config that does not fit is skipped
            print(f"  skip {model}.{op} M={m} {c}: {type(e).__name__}: {str(e)[:100]}",
                  flush=True)
    best = min(times, key=times.get) if times else None
    t_pdl = None
    if best is not None and pdl and not dry:
        cfg = GemmConfig(*best)
        try:
            t_pdl = timer(lambda i: ops.fused(i, cfg, True), ops.n_copies, reps)
        except Exception as e:
            print(f"  PDL failed {model}.{op} M={m}: {type(e).__name__}: {str(e)[:100]}",
                  flush=True)
    row = dict(model=model, op=op, kind=kind, n=n, k=k, m=m, weight_bytes=ops.w_bytes,
               cublas_us=t_cublas * 1e6, triton_us=times[best] * 1e6 if best else None,
               pdl_us=t_pdl * 1e6 if t_pdl else None, config=best,
               split_us=t_split * 1e6 if t_split else None,
               split_config=list(ops.split_cfg) if rope else None,
               all_us={str(c): t * 1e6 for c, t in times.items()})
    if best is None:
        return row, None
    fused_us = min(times[best], t_pdl or float("inf"))
    rival = min(t_cublas, t_split or float("inf"))
    entry = dict(winner="triton" if fused_us < rival else
                 ("split" if t_split and t_split < t_cublas else "cublas"), config=list(best),
                 triton_us=round(times[best] * 1e6, 2),
                 pdl_us=round(t_pdl * 1e6, 2) if t_pdl else None,
                 cublas_us=round(t_cublas * 1e6, 2))
    if rope:
        entry["split_us"] = round(t_split * 1e6, 2)
    return row, entry


def run(args: argparse.Namespace, out: Path) -> dict:
    from engine.model.gemm_table import m_bucket, shape_key

    dry = args.device == "cpu" or not torch.cuda.is_available()
    ms = [int(m) for m in args.ms.split(",")]
    configs = QUICK if args.quick else CONFIGS
    rope_configs = ROPE_QUICK if args.quick else ROPE_CONFIGS
    models = args.models.split(",")
    ops = args.ops.split(",")
    if dry:  # the code path on a CPU: torch twins, one tiny shape, two configurations
        print("fused-sweep: no GPU (or --device cpu): dry run, torch twins, nothing measured")
        MODELS["dry"] = (64, 96, 128)
        models, ms, configs, rope_configs = ["dry"], [1, 16], configs[:2], rope_configs[:2]
    min_bytes = 0 if dry else 128 << 20
    device_name = "cpu" if dry else torch.cuda.get_device_name(0)
    entries = json.loads(Path(args.base_table).read_text())["entries"] if args.base_table \
        else {}
    if not dry:
        kinds = {kind for model in models for op, kind, _, _ in gemms(model) if op in ops}
        block_ms = sorted({16 if m <= 16 else 32 if m <= 32 else 64 for m in ms})
        pdls = [False] if args.no_pdl else [False, True]
        jobs = {(kind, bm, c, pdl) for kind in kinds - {"norm_rope"} for bm in block_ms
                for c in configs for pdl in pdls}
        if "norm_rope" in kinds:  # one compile per head_dim; the split baseline's qkv too
            by_d = {HEADS[model][2]: HEADS[model] for model in models}
            jobs |= {("norm_rope", bm, c, pdl, heads) for heads in by_d.values()
                     for bm in block_ms for c in rope_configs for pdl in pdls}
            jobs |= {("norm", 16 if m <= 16 else 32 if m <= 32 else 64,
                      tuple(split_config(entries, n, k, m)), not args.no_pdl)
                     for model in models for op, _, n, k in gemms(model) if op == "qkv"
                     for m in ms}
        warm(sorted(jobs, key=str), args.workers)
    t_start = time.perf_counter()
    rows, skipped = [], []
    for model in models:
        for op, kind, n, k in gemms(model):
            if op not in ops:
                continue
            for m in ms:
                if time.perf_counter() - t_start > args.budget_s:
                    skipped.append(f"{model}.{op} m{m}")
                    continue
                row, entry = measure(model, op, kind, n, k, m,
                                     rope_configs if kind == "norm_rope" else configs,
                                     dry=dry, pdl=not args.no_pdl, min_bytes=min_bytes,
                                     entries=entries)
                rows.append(row)
                if entry is not None and m_bucket(m) == m:
                    entries[shape_key(kind, n, k, m)] = entry
                print(_line(row), flush=True)
        if not dry:
            torch.cuda.empty_cache()
    table = {"device": device_name, "note": "python -m bench fused-sweep; "
             "winner: the fused kernel (with or without PDL) vs cuBLAS + separate ops "
             "(norm_rope: vs the faster of that and split, the fused qkv + rope_and_cache)",
             "meta": report.meta(), "entries": entries}
    out.mkdir(parents=True, exist_ok=True)
    (out / "fused_table.json").write_text(json.dumps(table, indent=1))
    report.write_json(out / "fused_sweep.json", {"meta": report.meta(), "rows": rows,
                                                 "skipped": skipped, "dry": dry})
    md = markdown(rows, skipped)
    (out / "fused_sweep.md").write_text(md + "\n")
    print(md)
    wins = sum(e["winner"] == "triton" for e in entries.values())
    return {"dry": dry, "shapes": len(rows), "triton_wins": wins, "skipped": skipped}


HEADERS = ["model", "GEMM", "N x K", "M", "cuBLAS+ops (us)", "fused best (us)",
           "fused + PDL (us)", "config (BN,BK,warps,stages)", "split (us)", "faster",
           "% of 4.22 TB/s"]


def _cells(r: dict) -> list:
    """split: qkv_rope's other baseline, the fused qkv + rope_and_cache."""
    best = min(t for t in (r["triton_us"], r["pdl_us"]) if t is not None) \
        if r["triton_us"] else None
    split = r.get("split_us") or float("inf")
    rival = min(r["cublas_us"], split)
    faster = "fused" if best is not None and best < rival else \
        ("split" if split < r["cublas_us"] else "cuBLAS")
    t_win = min(rival, best or float("inf"))
    bw = r["weight_bytes"] / (t_win * 1e-6) / COPY_BW
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    return [r["model"], r["op"], f"{r['n']} x {r['k']}", r["m"], fmt(r["cublas_us"]),
            fmt(r["triton_us"]), fmt(r["pdl_us"]), str(tuple(r["config"] or ())),
            fmt(r.get("split_us")), faster, f"{bw:.0%}"]


def _line(r: dict) -> str:
    return "| " + " | ".join(str(c) for c in _cells(r)) + " |"


def markdown(rows: list[dict], skipped: list[str]) -> str:
    text = report.markdown_table(HEADERS, [_cells(r) for r in rows], "lllrrrrlrlr")
    if skipped:
        text += f"\n\nnot measured (time budget): {', '.join(skipped)}"
    return text
