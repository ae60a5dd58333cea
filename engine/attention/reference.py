"""Plain torch paged attention: the obviously-correct reference of the op.

Owns `paged_attention`, the CPU/eager implementation of the one attention op the engine
uses (flat batch of query tokens against a paged K/V cache, causal, GQA, optional sliding
window). It is the backend on CPU and the oracle the Triton kernel
(`engine.attention.triton_paged`) is tested against, so it favours being easy to check over being
fast: it loops over the distinct requests in Python and reads `token_req`/`token_pos` to the
host.

It must never be captured in a CUDA graph (it syncs with the host), never write the cache,
and never depend on Triton.
"""

from __future__ import annotations

import torch

# Upper bound on the fp32 score elements materialised at once (per query chunk), so a long
# prefill chunk against a long context does not allocate gigabytes on CPU.
_MAX_SCORE_ELEMENTS = 1 << 25


def check_paged_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    sliding_window: int | None,
    out: torch.Tensor | None,
) -> None:
    """Raise ValueError with a clear message when the arguments of the op do not fit together."""
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, D], got shape {tuple(q.shape)}")
    t, h, d = q.shape
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache and v_cache must both be [num_blocks, block_size, KVH, D], got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    kvh = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"cache head_dim {k_cache.shape[3]} != q head_dim {d}")
    if kvh == 0 or h % kvh != 0:
        raise ValueError(f"query heads H={h} must be a multiple of kv heads KVH={kvh}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}"
        )
    if block_tables.dim() != 2 or block_tables.dtype != torch.int32:
        raise ValueError(
            "block_tables must be a 2-D int32 tensor [R, max_blocks_per_req], got "
            f"{block_tables.dtype} {tuple(block_tables.shape)}"
        )
    for name, x in (("token_req", token_req), ("token_pos", token_pos)):
        if x.shape != (t,) or x.dtype != torch.int32:
            raise ValueError(
                f"{name} must be int32 of shape ({t},), got {x.dtype} {tuple(x.shape)}"
            )
    if sliding_window is not None and sliding_window <= 0:
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype):
        raise ValueError(
            f"out must match q ({q.dtype} {tuple(q.shape)}), got {out.dtype} {tuple(out.shape)}"
        )


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of a flat batch of query tokens against a paged K/V cache.

    q [T, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]; block_tables [R, W] int32;
    token_req [T] int32 (-1 = padding token, output 0); token_pos [T] int32 (the token attends
    to positions 0..token_pos of its request, and only to positions > token_pos -
    sliding_window when a window is set). Query head h reads kv head h // (H // KVH).
    Softmax in fp32. Returns [T, H, D] in q's dtype (written into `out` when given).
    """
    check_paged_attention_args(
        q, k_cache, v_cache, block_tables, token_req, token_pos, sliding_window, out
    )
    t, h, d = q.shape
    block_size, kvh = k_cache.shape[1], k_cache.shape[2]
    group = h // kvh
    if out is None:
        out = torch.empty_like(q)
    out.zero_()

    req_host = token_req.cpu()
    pos_host = token_pos.cpu()
    for r in torch.unique(req_host).tolist():
        if r < 0:
            continue  # padding tokens keep their zeros
        rows = torch.nonzero(req_host == r).flatten()
        pos = pos_host[rows]
        ctx = int(pos.max()) + 1
        key_pos = torch.arange(ctx)
        blocks = block_tables[r, key_pos // block_size].long()
        offsets = (key_pos % block_size).to(blocks.device)
        k = k_cache[blocks, offsets].float()  # [ctx, KVH, D]
        v = v_cache[blocks, offsets].float()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)

        chunk = max(1, _MAX_SCORE_ELEMENTS // (h * ctx))
        for start in range(0, rows.numel(), chunk):
            sub = rows[start : start + chunk]
            sub_pos = pos[start : start + chunk]
            visible = key_pos[None, :] <= sub_pos[:, None]  # [n, ctx]
            if sliding_window is not None:
                visible &= key_pos[None, :] > sub_pos[:, None] - sliding_window
            qs = q[sub.to(q.device)].float().transpose(0, 1)  # [H, n, D]
            scores = torch.matmul(qs, k.transpose(1, 2)) * scale  # [H, n, ctx]
            scores = scores.masked_fill(~visible.to(scores.device)[None], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[sub.to(out.device)] = torch.matmul(probs, v).transpose(0, 1).to(out.dtype)
    return out
