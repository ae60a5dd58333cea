"""Flat paged batches for the attention tests: build one, compute the dense answer, run
either backend into a NaN-poisoned output, compare with a relative error.

Shared by test_paged_attention_ref.py (the torch reference) and test_paged_attention.py (the
Triton kernel, interpreted and on CUDA). Every cache slot outside a request's context is
NaN and unused block-table entries point at other requests' blocks, so a stray read shows.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `pytest` (not `python -m pytest`) leaves the root out
    sys.path.insert(0, str(REPO_ROOT))

from engine.attention.reference import paged_attention as ref_attention  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


@dataclass
class Batch:
    """One flat batch over a paged cache, plus the contiguous K/V it was scattered from."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    token_req: torch.Tensor
    token_pos: torch.Tensor
    keys: list[torch.Tensor]  # per request [ctx, KVH, D], contiguous
    values: list[torch.Tensor]
    scale: float


def make_batch(
    specs: list[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str = "cpu",
    padding: int = 0,
    shuffle_tokens: bool = False,
    seed: int = 0,
) -> Batch:
    """specs[r] = (query tokens, context length): request r's queries are its last positions.

    Blocks are shuffled; unused block-table entries point at other requests' blocks and every
    cache slot outside a context is NaN, so reading anything not allowed poisons the result.
    """
    gen = torch.Generator().manual_seed(seed)
    n_blocks = [math.ceil(ctx / block_size) for _, ctx in specs]
    max_blocks = max(n_blocks) + 1
    total_blocks = sum(n_blocks) + 3
    shape = (total_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    perm = torch.randperm(total_blocks, generator=gen)
    block_tables = torch.empty((len(specs), max_blocks), dtype=torch.int32)
    keys, values, reqs, poss = [], [], [], []
    start = 0
    for r, (n_q, ctx) in enumerate(specs):
        assert 1 <= n_q <= ctx
        own = perm[start : start + n_blocks[r]]
        start += n_blocks[r]
        filler = torch.randint(0, total_blocks, (max_blocks - n_blocks[r],), generator=gen)
        block_tables[r] = torch.cat([own, filler]).int()
        k = torch.randn((ctx, kv_heads, head_dim), generator=gen).to(dtype)
        v = torch.randn((ctx, kv_heads, head_dim), generator=gen).to(dtype)
        pos = torch.arange(ctx)
        k_cache[own[pos // block_size], pos % block_size] = k
        v_cache[own[pos // block_size], pos % block_size] = v
        keys.append(k)
        values.append(v)
        reqs += [r] * n_q
        poss += list(range(ctx - n_q, ctx))
    if shuffle_tokens:
        order = torch.randperm(len(reqs), generator=gen).tolist()
        reqs = [reqs[i] for i in order]
        poss = [poss[i] for i in order]
    reqs += [-1] * padding
    poss += [0] * padding
    q = torch.randn((len(reqs), heads, head_dim), generator=gen).to(dtype)
    return Batch(
        q=q.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=block_tables.to(device),
        token_req=torch.tensor(reqs, dtype=torch.int32, device=device),
        token_pos=torch.tensor(poss, dtype=torch.int32, device=device),
        keys=keys,
        values=values,
        scale=head_dim**-0.5,
    )


def dense_attention(b: Batch, sliding_window: int | None) -> torch.Tensor:
    """Independent oracle: float64 SDPA per request over the contiguous K/V, GQA expanded."""
    t, h, d = b.q.shape
    kvh = b.keys[0].shape[1] if b.keys else 1
    out = torch.zeros((t, h, d), dtype=torch.float64)
    req, pos = b.token_req.cpu(), b.token_pos.cpu()
    for r, (k, v) in enumerate(zip(b.keys, b.values, strict=True)):
        rows = (req == r).nonzero().flatten()
        key_pos = torch.arange(k.shape[0])
        mask = key_pos[None, :] <= pos[rows][:, None]
        if sliding_window is not None:
            mask &= pos[rows][:, None] - key_pos[None, :] < sliding_window
        qr = b.q.cpu()[rows].double().transpose(0, 1)[None]  # [1, H, n, D]
        kr = k.double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)[None]
        vr = v.double().repeat_interleave(h // kvh, dim=1).transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=b.scale)
        out[rows] = o[0].transpose(0, 1)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def run_ref(b: Batch, sliding_window: int | None = None) -> torch.Tensor:
    out = torch.full_like(b.q, float("nan"))
    res = ref_attention(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, b.scale,
        sliding_window=sliding_window, out=out,
    )
    assert res is out
    return out


def run_triton(
    b: Batch,
    sliding_window: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    min_tiles: int | None = None,
    pdl: bool | None = None,
    table_ahead: bool | None = None,
) -> torch.Tensor:
    from engine.attention.triton_paged import paged_attention

    out = torch.full_like(b.q, float("nan"))
    res = paged_attention(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, b.scale,
        sliding_window=sliding_window, out=out, num_splits=num_splits, block_n=block_n,
        min_tiles=min_tiles, pdl=pdl, table_ahead=table_ahead,
    )
    assert res is out
    return out


def assert_padding_zero(b: Batch, out: torch.Tensor) -> None:
    pad = b.token_req == -1
    assert torch.equal(out[pad], torch.zeros_like(out[pad])), "padding tokens must output 0"


# A mixed step: decodes at short and block-boundary contexts, a fresh prefill, prefill
# chunks continuing a prompt, and a single-token context.
MIXED = [(1, 1), (1, 37), (9, 9), (1, 16), (6, 50), (1, 33), (3, 20)]
