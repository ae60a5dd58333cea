"""Plain torch paged attention: the obviously-correct reference of the op.

Owns `paged_attention`, the CPU/eager implementation of the one attention op the engine
uses (flat batch of query tokens against a paged K/V cache, causal, GQA, optional sliding
window). It is the backend on CPU and the oracle the Triton kernel
(`engine.attention.triton_paged`) is tested against, so it favours being easy to check over being
fast, but it does no per-token Python work, in two batched forms:

- a request with several query tokens in the batch (a prefill chunk) gathers its cached K/V
  once through its block table and attends with two matmuls under a causal mask: one
  computation per chunk, linear in the context it reads (gathering the context per query
  token instead, as this file once did, made a 1,023-token CPU prefill ~18x slower);
- single query tokens (decodes) are one computation for all of them together: each gathers
  its own request's context, padded to the longest and masked.

It reads the query tokens' requests and the longest position to the host once.

It must never be captured in a CUDA graph (it syncs with the host), never write the cache,
and never depend on Triton.
"""

from __future__ import annotations

import torch

# Upper bound on the fp32 elements (gathered K/V and scores) materialised at once, so a long
# prefill chunk against a long context does not allocate gigabytes on CPU.
_MAX_SCORE_ELEMENTS = 1 << 25


def checked_output(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    sliding_window: int | None,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The tensor the op writes (`out`, or a new one like q), once its arguments are checked.

    Raises ValueError with a clear message when the arguments do not fit together. Shared by
    both backends, so they accept exactly the same inputs.
    """
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
    return torch.empty_like(q) if out is None else out


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
    pdl: bool | None = None,
    kv_prefetch: bool = False,
) -> torch.Tensor:
    """Causal attention of a flat batch of query tokens against a paged K/V cache.

    q [T, H, D]; k_cache, v_cache [num_blocks, block_size, KVH, D]; block_tables [R, W] int32;
    token_req [T] int32 (-1 = padding token, output 0); token_pos [T] int32 (the token attends
    to positions 0..token_pos of its request, and only to positions > token_pos -
    sliding_window when a window is set). Query head h reads kv head h // (H // KVH).
    Softmax in fp32. Returns [T, H, D] in q's dtype (written into `out` when given).
    `pdl` and `kv_prefetch` are the Triton kernel's launch options; nothing to launch here,
    so they are accepted and ignored (the model passes them to whichever backend it has).
    """
    out = checked_output(
        q, k_cache, v_cache, block_tables, token_req, token_pos, sliding_window, out
    )
    t, h, d = q.shape
    if t == 0:
        return out
    req_host = token_req.tolist()  # the one host sync (with the longest position below)
    counts: dict[int, int] = {}
    for r in req_host:
        counts[r] = counts.get(r, 0) + 1
    chunked = {r for r, n in counts.items() if r >= 0 and n > 1}
    if not chunked:
        _per_token(q, k_cache, v_cache, block_tables, token_req, token_pos, scale,
                   sliding_window, out)
        return out
    rows = torch.tensor(req_host)
    for r in chunked:  # a few prefill chunks per step: one matmul pair each
        idx = (rows == r).nonzero().squeeze(1).to(q.device)
        out[idx] = _chunk(q[idx], k_cache, v_cache, block_tables[r], token_pos[idx], scale,
                          sliding_window).to(out.dtype)
    single = [i for i, r in enumerate(req_host) if r not in chunked]
    if single:
        idx = torch.tensor(single, device=q.device)
        sub = torch.empty_like(q[idx])
        _per_token(q[idx], k_cache, v_cache, block_tables, token_req[idx], token_pos[idx],
                   scale, sliding_window, sub)
        out[idx] = sub
    return out


def _chunk(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table_row: torch.Tensor,
    pos: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """One request's query tokens q [n, H, D] at positions pos [n] against its context, which
    is gathered once: [n, H, D] fp32."""
    n, h, d = q.shape
    num_blocks, block_size, kvh = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    group = h // kvh
    ctx = int(pos.max()) + 1
    key_pos = torch.arange(ctx, device=q.device)
    blocks = table_row[: -(-ctx // block_size)].long()
    slots = (blocks[:, None] * block_size + torch.arange(block_size, device=q.device)).flatten()
    slots = slots[:ctx].clamp(0, num_blocks * block_size - 1)
    k = k_cache.view(-1, kvh, d)[slots].float().permute(1, 0, 2)  # [KVH, ctx, D]
    v = v_cache.view(-1, kvh, d)[slots].float().permute(1, 0, 2)
    seen = key_pos[None, :] <= pos.long()[:, None]  # [n, ctx]
    if sliding_window is not None:
        seen &= key_pos[None, :] > pos.long()[:, None] - sliding_window
    v = v.masked_fill(~seen.any(0)[None, :, None], 0.0)  # unread slots may hold NaN/inf
    qs = q.float().view(n, kvh, group, d).permute(1, 2, 0, 3).reshape(kvh, group * n, d)
    res = torch.empty(kvh, group * n, d, dtype=torch.float32, device=q.device)
    rows = max(1, _MAX_SCORE_ELEMENTS // (kvh * ctx))  # bound the scores held at once
    mask = ~seen.repeat(group, 1)  # row g*n + i is query token i of head group g
    for start in range(0, group * n, rows):
        sl = slice(start, start + rows)
        scores = torch.matmul(qs[:, sl], k.transpose(1, 2)) * scale  # [KVH, rows, ctx]
        scores.masked_fill_(mask[None, sl], float("-inf"))
        res[:, sl] = torch.matmul(torch.softmax(scores, dim=-1), v)
    return res.view(kvh, group, n, d).permute(2, 0, 1, 3).reshape(n, h, d)


def _per_token(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,
) -> None:
    """Every token gathers its request's keys 0..ctx-1 (ctx = the longest context here)
    through the block table; what it may not see is masked. Right for decodes (one token per
    request), where gathering per token is gathering per request."""
    t, h, d = q.shape
    num_blocks, block_size, kvh = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    group = h // kvh
    ctx = int(token_pos.max()) + 1
    key_pos = torch.arange(ctx, device=q.device)
    valid = token_req >= 0
    req = token_req.clamp(min=0).long()
    pos = token_pos.long()
    blk_col = (key_pos // block_size).clamp(max=block_tables.shape[1] - 1)
    k_flat = k_cache.view(num_blocks * block_size, kvh, d)
    v_flat = v_cache.view(num_blocks * block_size, kvh, d)
    per_token = ctx * (2 * kvh * d + 2 * h)
    chunk = max(1, _MAX_SCORE_ELEMENTS // per_token)
    for start in range(0, t, chunk):  # a few chunks bound the memory, not one per request
        sl = slice(start, start + chunk)
        blocks = block_tables[req[sl]][:, blk_col].long()  # [n, ctx]
        slots = (blocks * block_size + key_pos % block_size).clamp(0, k_flat.shape[0] - 1)
        visible = (key_pos[None, :] <= pos[sl, None]) & valid[sl, None]  # [n, ctx]
        if sliding_window is not None:
            visible &= key_pos[None, :] > pos[sl, None] - sliding_window
        k = k_flat[slots].float()  # [n, ctx, KVH, D]
        v = v_flat[slots].float()
        qs = q[sl].float().view(-1, kvh, group, d)  # head h = kv head h // group
        scores = torch.einsum("nkgd,nckd->nkgc", qs, k) * scale
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        # Unread slots may hold NaN/inf: zero their values so 0 * garbage stays 0.
        v = v.masked_fill(~visible[:, :, None, None], 0.0)
        probs = torch.softmax(scores, dim=-1)  # a real token always sees itself
        probs = probs.masked_fill(~valid[sl, None, None, None], 0.0)  # padding: all masked
        res = torch.einsum("nkgc,nckd->nkgd", probs, v).reshape(-1, h, d)
        out[sl] = res.to(out.dtype)
