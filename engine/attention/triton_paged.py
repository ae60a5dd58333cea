"""Triton paged attention: one launch serves a flat batch of prefill chunks and decodes.

Owns `paged_attention` for CUDA, the same op and signature as `engine.attention.reference` (the
torch reference it is tested against), and the two kernels behind it:

- `_paged_attention_kernel`: grid (T, KVH, num_splits). Program (t, kvh, s) is a *leader*
  when token t starts a query block: t is a multiple of BLOCK_Q, or its request differs
  from token t-1's. A leader takes the tokens t.. up to the next multiple of BLOCK_Q that
  belong to its request, times the G = H // KVH query heads sharing kv head `kvh` (GQA
  packing), as the rows of one tile of BLOCK_M >= 16 rows (the tl.dot minimum). Other
  programs return at once. It walks its request's context in BLOCK_N-key tiles fetched
  through the block table, with an online softmax in fp32. With split-K (num_splits > 1)
  split s takes the s-th share of the key tiles and writes an unnormalised partial result.
- `_reduce_splits_kernel`: merges the split partials (log-sum-exp weights) into `out`.

CUDA-graph safety: the grid and every Python decision depend only on shapes, dtypes and
the device, never on tensor values; there is no host sync and no `.item()`. Padding
tokens (token_req == -1) get zeros and read nothing from the cache.

This module must never write the K/V cache, allocate per-value buffers, or branch in Python
on tensor contents.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.attention.reference import checked_output

LOG2E = 1.4426950408889634

# Below this many (token, kv head) programs per SM, long decodes split their keys. Measured
# on the H200 (docs/benchmarks.md, `python -m bench attention`): at batch 32 x 8 kv heads (256
# programs, ~2 per SM) one split with 128-key tiles was fastest at contexts 1280 and 8448
# (84% and 97% of the KV-bytes floor, against 69% and lower with 4 splits of 64 keys).
_PROGRAMS_PER_SM_TARGET = 1
_MAX_SPLITS = 16


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    T, max_blocks,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb,
    stride_ot, stride_oh, stride_od,
    scale_log2,
    window,
    H: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD
    t0 = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    req0 = tl.load(req_ptr + t0)
    req_prev = tl.load(req_ptr + t0 - 1, mask=t0 > 0, other=-2)
    if (t0 % BLOCK_Q != 0) & (req_prev == req0):
        return  # not a leader: the leader of this token's query block computes it

    # Rows of the tile: m = qi * G_PAD + g, query token t0 + qi, query head kvh * G + g.
    offs_m = tl.arange(0, BLOCK_M)
    qi = offs_m // G_PAD
    g = offs_m % G_PAD
    tok = t0 + qi
    in_block = (tok < T) & (tok < (t0 // BLOCK_Q + 1) * BLOCK_Q)
    tok_req = tl.load(req_ptr + tok, mask=in_block, other=-2)
    tok_same = in_block & (tok_req == req0)
    # Vector & vector on purpose: the 3.9 interpreter turns bool-vector & bool-scalar into
    # int32 and then rejects it as a mask. tok_req == req0 wherever tok_same holds.
    tok_ok = tok_same & (tok_req >= 0)
    row_ok = tok_ok & (g < G)
    head = kvh * G + g
    tok_pos = tl.load(pos_ptr + tok, mask=tok_ok, other=0)

    # Key range of the whole block; empty for a padding block.
    hi = tl.max(tl.where(tok_ok, tok_pos + 1, 0), axis=0)
    lo = 0
    if HAS_WINDOW:
        lo = tl.min(tl.where(tok_ok, tok_pos - window + 1, 2147483647), axis=0)
        lo = tl.maximum(lo, 0)
    tile_lo = lo // BLOCK_N
    tile_hi = tl.cdiv(hi, BLOCK_N)
    tiles_per_split = tl.cdiv(tl.maximum(tile_hi - tile_lo, 0), NUM_SPLITS)
    my_lo = tile_lo + split * tiles_per_split
    my_hi = tl.minimum(my_lo + tiles_per_split, tile_hi)

    offs_d = tl.arange(0, D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None], other=0.0,
    )
    req_safe = tl.maximum(req0, 0).to(tl.int64)
    bt_row = bt_ptr + req_safe * stride_btr
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for tile in range(my_lo, my_hi):
        key = tile * BLOCK_N + offs_n
        key_ok = (key < hi) & (key >= lo) & (key // BLOCK_SIZE < max_blocks)
        blk = tl.load(bt_row + (key // BLOCK_SIZE) * stride_btb, mask=key_ok, other=0)
        slot = key % BLOCK_SIZE
        k_off = blk.to(tl.int64) * stride_kb + slot * stride_ks + kvh * stride_kh
        v_off = blk.to(tl.int64) * stride_vb + slot * stride_vs + kvh * stride_vh
        k = tl.load(
            k_ptr + k_off[:, None] + offs_d[None, :] * stride_kd,
            mask=key_ok[:, None], other=0.0,
        )
        if IEEE_DOT:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = key_ok[None, :] & (key[None, :] <= tok_pos[:, None]) & row_ok[:, None]
        if HAS_WINDOW:
            visible = visible & (key[None, :] > tok_pos[:, None] - window)
        s = tl.where(visible, s * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no visible key yet keeps m = -inf; shift by 0 to avoid nan.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr + v_off[:, None] + offs_d[None, :] * stride_vd,
            mask=key_ok[:, None], other=0.0,
        )
        if IEEE_DOT:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS == 1:
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh
            + offs_d[None, :] * stride_od,
            res.to(out_ptr.dtype.element_ty),
            mask=(tok_same & (g < G))[:, None],  # a padding block stores its zeros
        )
    else:
        # Partials, contiguous: acc [S, T, H, D], (m, l) [S, T, H, 2]; every split writes its
        # rows, empty ones included (m = -inf, l = 0), so the reduce reads no garbage.
        row = (split * T + tok) * H + head
        st_mask = tok_ok & (g < G)
        tl.store(part_acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=st_mask[:, None])
        tl.store(part_ml_ptr + row * 2, m_i, mask=st_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=st_mask)


@triton.jit
def _reduce_splits_kernel(
    part_acc_ptr, part_ml_ptr, req_ptr, out_ptr,
    T,
    stride_ot, stride_oh, stride_od,
    H: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D)
    req = tl.load(req_ptr + t + offs_s * 0)  # broadcast as a vector (see the kernel above)
    s_ok = (offs_s < NUM_SPLITS) & (req >= 0)
    row = (offs_s * T + t) * H + h
    m = tl.load(part_ml_ptr + row * 2, mask=s_ok, other=float("-inf"))
    lsum = tl.load(part_ml_ptr + row * 2 + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_shift = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(s_ok & (lsum > 0), tl.exp2(m - m_shift), 0.0)
    denom = tl.sum(w * lsum, axis=0)
    acc = tl.load(
        part_acc_ptr + row[:, None] * D + offs_d[None, :], mask=s_ok[:, None], other=0.0
    )
    res = tl.sum(acc * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + t * stride_ot + h * stride_oh + offs_d * stride_od,
        res.to(out_ptr.dtype.element_ty),
    )


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(num_tokens: int, kv_heads: int, device: torch.device) -> int:
    """Split-K factor chosen from shapes only: split when (token, kv head) programs are few.

    Few programs means a decode-sized batch; each then streams a long context alone, so
    splitting its keys fills the GPU. Splits past a short context exit at once.
    """
    if device.type != "cuda":
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    programs = max(1, num_tokens * kv_heads)
    splits = 1
    while splits < _MAX_SPLITS and programs * splits < _PROGRAMS_PER_SM_TARGET * sms:
        splits *= 2
    return splits


def _tile_shape(
    group: int, head_dim: int, block_n: int | None, elem_size: int = 2
) -> tuple[int, int, int]:
    """(G_PAD, BLOCK_Q, BLOCK_N): rows padded to the 16-row tl.dot minimum, key tile size.

    BLOCK_N and the cache block size are both powers of two, so the key tile is always a
    multiple or a divisor of a cache block.
    """
    g_pad = triton.next_power_of_2(group)
    block_q = max(1, 16 // g_pad)
    if block_n is None:
        # 128-key tiles measured best for 16-bit D=128; keep K+V stages within shared memory.
        row_bytes = head_dim * elem_size
        block_n = 128 if row_bytes <= 256 else 64 if row_bytes <= 512 else 32
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    return g_pad, block_q, block_n


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
    *,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_stages: int = 3,
) -> torch.Tensor:
    """Causal paged attention of a flat batch (see `engine.attention.reference.paged_attention`).

    The keyword-only tuning the engine leaves at its defaults (the benchmark and the tests
    compare configurations): split-K factor (None: `default_num_splits`), key tile size
    (None: by the bytes of a K/V row, see `_tile_shape`) and software-pipeline depth (3
    lets Triton prefetch the block-table entries as well as the K/V tiles).
    """
    out = checked_output(
        q, k_cache, v_cache, block_tables, token_req, token_pos, sliding_window, out
    )
    t, h, d = q.shape
    block_size, kvh = k_cache.shape[1], k_cache.shape[2]
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 for the Triton kernel, got {d}")
    if block_size & (block_size - 1):
        raise ValueError(
            f"block_size must be a power of two for the Triton kernel, got {block_size}"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype must be float16, bfloat16 or float32, got {q.dtype}")
    group = h // kvh
    if t == 0:
        return out
    if num_splits is None:
        num_splits = default_num_splits(t, kvh, q.device)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")

    g_pad, block_q, block_n = _tile_shape(group, d, block_n, k_cache.element_size())
    if num_splits > 1:
        part_acc = torch.empty((num_splits, t, h, d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((num_splits, t, h, 2), dtype=torch.float32, device=q.device)
    else:
        part_acc = part_ml = out  # unused by the kernel when NUM_SPLITS == 1
    _paged_attention_kernel[(t, kvh, num_splits)](
        q, k_cache, v_cache, block_tables, token_req, token_pos, out, part_acc, part_ml,
        t, block_tables.shape[1],
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        scale * LOG2E,
        sliding_window if sliding_window is not None else 0,
        H=h, G=group, G_PAD=g_pad, BLOCK_Q=block_q, D=d, BLOCK_SIZE=block_size,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, HAS_WINDOW=sliding_window is not None,
        IEEE_DOT=q.dtype == torch.float32,
        num_warps=4 if block_n <= 64 else 8, num_stages=num_stages,
    )
    if num_splits > 1:
        _reduce_splits_kernel[(t, h)](
            part_acc, part_ml, token_req, out,
            t,
            out.stride(0), out.stride(1), out.stride(2),
            H=h, D=d, NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits),
            num_warps=4 if d >= 128 else 2,
        )
    return out
