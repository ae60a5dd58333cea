"""Per-shape choice for the decode GEMMs of the fused layer: cuBLAS with the separate
norm/SiLU/add kernels, or the fused Triton kernel, and that kernel's tile configuration.

Owns the table `python -m bench fused-sweep` measures on a GPU (committed next to this file as
`gemm_table.json`; config key `gemm_table` names another one), the bucket of M a shape falls
in, and the fallback where the table has no entry. Pure host-side Python, read at capture
time; never imports bench/ or triton.

Key: "<kind>:<N>x<K>:m<bucket>", kind one of KINDS (which prologue/epilogue the kernel runs;
"norm_rope": the qkv GEMM with rotary and the KV write in its epilogue, engine/model/fused_rope.py),
N the output columns (the intermediate size for "norm_pair"), K the reduction, bucket the
smallest swept M >= the batch. A "norm_rope" entry's rival is the faster of its two-kernel
alternatives: cuBLAS + add_rms_norm + rope_and_cache ("cublas_us") and the fused norm-prologue
GEMM + rope_and_cache ("split_us"). Fallback: no entry (another GPU, an unswept shape, or M above
the largest bucket, e.g. prefill) -> cuBLAS under decode_layer "auto", `heuristic_config` under
"fused".
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

KINDS = ("norm", "norm_pair", "residual", "norm_rope")
M_BUCKETS = (1, 16, 32)
TABLE_PATH = Path(__file__).with_name("gemm_table.json")
NUM_SMS_GUESS = 132  # a Hopper's SM count; only the fallback uses it


class GemmConfig(NamedTuple):
    """The fused kernel's launch configuration (BLOCK_M follows the batch)."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def m_bucket(m: int) -> int | None:
    """The smallest swept M that covers a batch of m rows; None above the largest."""
    return next((b for b in M_BUCKETS if m <= b), None)


def shape_key(kind: str, n: int, k: int, bucket: int) -> str:
    return f"{kind}:{n}x{k}:m{bucket}"


def heuristic_config(n: int, k: int) -> GemmConfig:
    """No measurement: the widest N tile that still gives every SM a program, a long K tile."""
    block_n = 64
    while block_n > 16 and -(-n // block_n) < NUM_SMS_GUESS:
        block_n //= 2
    return GemmConfig(block_n, 256 if block_n == 16 else 128, 4, 3)


@functools.cache
def device_name(index: int) -> str:
    import torch

    return torch.cuda.get_device_name(index)


@functools.cache
def load_table(path: str) -> dict:
    """{"device": name, "entries": {key: {"config": [4 ints], "triton_us": .., "pdl_us": ..,
    "cublas_us": .., "winner": ..}}} (times in us); an absent file is an empty table."""
    p = Path(path)
    if not p.is_file():
        return {"device": None, "entries": {}}
    return json.loads(p.read_text())


def lookup(kind: str, n: int, k: int, m: int, device_name: str | None,
           table_path: str | None = None) -> dict | None:
    """The entry for this shape on this GPU of the table at `table_path` (None: the shipped
    one), or None."""
    bucket = m_bucket(m)
    table = load_table(table_path or str(TABLE_PATH))
    if bucket is None or device_name is None or table.get("device") != device_name:
        return None
    return table["entries"].get(shape_key(kind, n, k, bucket))


def choose(layer: str, kind: str, n: int, k: int, m: int, device_name: str | None,
           pdl: bool = False, table_path: str | None = None) -> GemmConfig | None:
    """None: cuBLAS and the separate ops; else the fused kernel with this configuration.
    layer (config key decode_layer) "fused": always the fused kernel, its measured
    configuration or the heuristic; "auto": the fused kernel where the table measured it
    faster than cuBLAS + ops (its PDL time when `pdl`); "cublas": never."""
    assert kind in KINDS, kind
    entry = lookup(kind, n, k, m, device_name, table_path)
    if layer == "fused":
        return GemmConfig(*entry["config"]) if entry else heuristic_config(n, k)
    if layer != "auto" or not entry:
        return None
    fused_us = (entry.get("pdl_us") if pdl else None) or entry["triton_us"]
    rival = min(entry["cublas_us"], entry.get("split_us") or float("inf"))
    return GemmConfig(*entry["config"]) if fused_us < rival else None
