"""Triton paged attention: one launch serves a flat batch of prefill chunks and decodes.

Owns `paged_attention` for CUDA, the same op and signature as `engine.attention.reference` (the
torch reference it is tested against), and the one kernel behind it, grid (T, KVH, num_splits).

Program (t, kvh, s) is a *leader* when token t starts a query block: t is a multiple of
BLOCK_Q, or its request differs from token t-1's. A leader takes the tokens t.. up to the next
multiple of BLOCK_Q that belong to its request, times the G = H // KVH query heads sharing kv
head `kvh` (GQA packing: K/V are read once for the whole group), as the rows of one tile of
BLOCK_M >= 16 rows (the tl.dot minimum). Other programs return at once. It walks its
request's context in BLOCK_N-key tiles fetched through the block table, with an online
softmax in fp32.

Split-K without a second kernel: split s takes its share of the key tiles, at least
`min_tiles` of them, so a short context uses fewer splits than the grid has (the rest exit at
once). With one split in use the program writes `out` directly. Otherwise each split writes an
unnormalised partial, then bumps a per-(query block, kv head) counter; the split that arrives
last merges the partials (log-sum-exp weights) into `out` and resets the counter to 0 for the
next launch. Counters live in one zeroed buffer per (device, stream): two launches that share
a buffer must never run at the same time, which stream order guarantees.

Programmatic dependent launch (`pdl=True`, sm_90+): the program may start while the previous
kernel still runs. It reads the step's metadata (token_req, token_pos, and with `table_ahead`
the first block-table entries) at once, then waits for that kernel (`gdc_wait`) before it
reads q or the cache, which that kernel writes, and lets the next kernel launch
(`gdc_launch_dependents`). So the metadata must never be written by a kernel of the step: it
is written by the step's host-to-device copy (or a broadcast) before its first kernel, which
every later launch follows even under PDL. Split counters are touched only after the wait.

CUDA-graph safety: the grid and every Python decision depend only on shapes, dtypes and
the device, never on tensor values; there is no host sync and no `.item()`. Padding
tokens (token_req == -1) get zeros and read nothing from the cache.

This module must never write the K/V cache or branch in Python on tensor contents.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.l2_prefetch import PREFETCH_KEYS, kv_prefetch_fits, prefetch_kv
from engine.attention.reference import checked_output
from engine.attention.triton_config import (
    LaunchConfig,
    choose_config,
    pdl_available,
)

LOG2E = 1.4426950408889634
_PREFETCH_KEYS = tl.constexpr(PREFETCH_KEYS)


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, part_acc_ptr, part_ml_ptr, sem_ptr,
    T, max_blocks, num_splits, min_tiles,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb,
    stride_ot, stride_oh, stride_od,
    scale_log2,
    window,
    H: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr, USE_PDL: tl.constexpr,
    TABLE_AHEAD: tl.constexpr, SPLIT: tl.constexpr,
):
    """Grid (T, KVH, num_splits): program (t, kvh, s) runs `_attention_tile`."""
    _attention_tile(tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1),
                    q_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, part_acc_ptr,
                    part_ml_ptr, sem_ptr, T, max_blocks, num_splits, min_tiles, stride_qt,
                    stride_qh, stride_qd, stride_kb, stride_ks, stride_kh, stride_kd, stride_vb,
                    stride_vs, stride_vh, stride_vd, stride_btr, stride_btb, stride_ot, stride_oh,
                    stride_od, scale_log2, window, H, G, G_PAD, BLOCK_Q, D, BLOCK_SIZE, BLOCK_N,
                    HAS_WINDOW, IEEE_DOT, USE_PDL, TABLE_AHEAD, SPLIT)


@triton.jit
def _attention_tile(
    t0, kvh, split, num_kvh,
    q_ptr, k_ptr, v_ptr, bt_ptr, req_ptr, pos_ptr, out_ptr, part_acc_ptr, part_ml_ptr, sem_ptr,
    T, max_blocks, num_splits, min_tiles,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btr, stride_btb,
    stride_ot, stride_oh, stride_od,
    scale_log2,
    window,
    H: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_Q: tl.constexpr,
    D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_WINDOW: tl.constexpr, IEEE_DOT: tl.constexpr, USE_PDL: tl.constexpr,
    TABLE_AHEAD: tl.constexpr, SPLIT: tl.constexpr,
):
    """Query block t0 (if t0 leads one), kv head kvh, split `split` of the launch: the body of
    `_paged_attention_kernel` (module docstring). num_kvh: the grid's kv-head extent."""
    BLOCK_M: tl.constexpr = BLOCK_Q * G_PAD

    # Rows of the tile: m = qi * G_PAD + g, query token t0 + qi, query head kvh * G + g.
    offs_m = tl.arange(0, BLOCK_M)
    qi = offs_m // G_PAD
    g = offs_m % G_PAD
    tok = t0 + qi
    in_block = (tok < T) & (tok < (t0 // BLOCK_Q + 1) * BLOCK_Q)
    # The step's metadata in one memory round trip (masks from indices only): then the
    # block table and q together, then K/V. Rows of another request are masked out below.
    req0 = tl.load(req_ptr + t0)
    req_prev = tl.load(req_ptr + t0 - 1, mask=t0 > 0, other=-2)
    tok_req = tl.load(req_ptr + tok, mask=in_block, other=-2)
    tok_pos = tl.load(pos_ptr + tok, mask=in_block, other=0)
    if (t0 % BLOCK_Q != 0) & (req_prev == req0):
        return  # not a leader: the leader of this token's query block computes it

    tok_same = in_block & (tok_req == req0)
    # Vector & vector on purpose: the 3.9 interpreter turns bool-vector & bool-scalar into
    # int32 and then rejects it as a mask. tok_req == req0 wherever tok_same holds.
    tok_ok = tok_same & (tok_req >= 0)
    row_ok = tok_ok & (g < G)
    head = kvh * G + g

    # Key range of the whole block; empty for a padding block.
    hi = tl.max(tl.where(tok_ok, tok_pos + 1, 0), axis=0)
    lo = 0
    if HAS_WINDOW:
        lo = tl.min(tl.where(tok_ok, tok_pos - window + 1, 2147483647), axis=0)
        lo = tl.maximum(lo, 0)
    tile_lo = lo // BLOCK_N
    tile_hi = tl.cdiv(hi, BLOCK_N)
    if SPLIT:
        n_tiles = tl.maximum(tile_hi - tile_lo, 0)
        per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), min_tiles)
        n_active = tl.maximum(tl.cdiv(n_tiles, per_split), 1)  # the same in every split
        if split >= n_active:
            return  # a short context leaves this split nothing; the merge does not wait for it
        my_lo = tile_lo + split * per_split
        my_hi = tl.minimum(my_lo + per_split, tile_hi)
    else:
        n_active = 1
        my_lo = tile_lo
        my_hi = tile_hi

    req_safe = tl.maximum(req0, 0).to(tl.int64)
    bt_row = bt_ptr + req_safe * stride_btr
    offs_n = tl.arange(0, BLOCK_N)
    if TABLE_AHEAD:  # issued before q's load, so the two are in flight together
        key_a = my_lo * BLOCK_N + offs_n
        blk_next = tl.load(bt_row + (key_a // BLOCK_SIZE) * stride_btb,
                           mask=(key_a < hi) & (key_a // BLOCK_SIZE < max_blocks), other=0)
    else:
        blk_next = tl.zeros([BLOCK_N], dtype=tl.int32)
    if USE_PDL:
        # Everything above read only the step's metadata, which no kernel of the step writes;
        # q and the cache (this step's K/V row) are the previous kernel's output. USE_PDL 2:
        # the first K/V tiles are asked of L2 meanwhile (l2_prefetch says why that is safe).
        if USE_PDL >= 2:
            prefetch_kv(bt_row, stride_btb, max_blocks, k_ptr, v_ptr, kvh, my_lo * BLOCK_N,
                        tl.minimum(hi, my_hi * BLOCK_N), stride_kb, stride_ks, stride_kh,
                        stride_vb, stride_vs, stride_vh, BLOCK_SIZE, D, _PREFETCH_KEYS)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    offs_d = tl.arange(0, D)
    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh
        + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None], other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for tile in range(my_lo, my_hi):
        key = tile * BLOCK_N + offs_n
        key_ok = (key < hi) & (key >= lo) & (key // BLOCK_SIZE < max_blocks)
        if TABLE_AHEAD:
            # The block numbers of the next tile are loaded one tile ahead, into registers:
            # then no load of this iteration feeds the K/V addresses, and Triton's pipeliner
            # keeps num_stages - 1 K/V tiles in flight instead of one.
            blk = blk_next
            key_a = key + BLOCK_N
            blk_next = tl.load(bt_row + (key_a // BLOCK_SIZE) * stride_btb,
                               mask=(key_a < hi) & (key_a // BLOCK_SIZE < max_blocks), other=0)
        else:
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

    out_ptrs = (out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh
                + offs_d[None, :] * stride_od)
    out_mask = (tok_same & (g < G))[:, None]  # a padding block stores its zeros
    if (not SPLIT) or (n_active == 1):
        res = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        # Partials, contiguous: acc [S, T, H, D], (m, l) [S, T, H, 2].
        row = (split * T + tok) * H + head
        st_mask = tok_ok & (g < G)
        tl.store(part_acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=st_mask[:, None])
        tl.store(part_ml_ptr + row * 2, m_i, mask=st_mask)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=st_mask)
        # Every thread's partial is stored before the one release below publishes them.
        tl.debug_barrier()
        sem = sem_ptr + t0 * num_kvh + kvh
        arrived = tl.atomic_add(sem, 1, sem="acq_rel", scope="gpu")
        if arrived == n_active - 1:  # last split of this block: merge all partials
            m_all = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_all = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc_all = tl.zeros([BLOCK_M, D], dtype=tl.float32)
            for s_idx in range(0, n_active):
                row_s = (s_idx * T + tok) * H + head
                # .cg: read from L2, where the other splits' stores landed, never from L1.
                m_s = tl.load(part_ml_ptr + row_s * 2, mask=st_mask, other=float("-inf"),
                              cache_modifier=".cg")
                l_s = tl.load(part_ml_ptr + row_s * 2 + 1, mask=st_mask, other=0.0,
                              cache_modifier=".cg")
                acc_s = tl.load(part_acc_ptr + row_s[:, None] * D + offs_d[None, :],
                                mask=st_mask[:, None], other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m_all, m_s)
                m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
                a_old = tl.exp2(m_all - m_shift)
                a_s = tl.exp2(m_s - m_shift)
                l_all = l_all * a_old + l_s * a_s
                acc_all = acc_all * a_old[:, None] + acc_s * a_s[:, None]
                m_all = m_new
            res = acc_all / tl.where(l_all > 0, l_all, 1.0)[:, None]
            tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(sem, 0)  # ready for the next launch (graph replays included)


_SEMAPHORES: dict[tuple[str, int | None, int], torch.Tensor] = {}


def _semaphores(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer of >= n split counters for launches on the current stream.

    The kernel leaves every counter at 0, so the buffer is zeroed once, when it is made
    (outside a graph capture in the engine, whose warm-up runs each shape eagerly first).
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _SEMAPHORES.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(4096, triton.next_power_of_2(n)), dtype=torch.int32, device=device)
        _SEMAPHORES[key] = buf
    return buf


def _tile_shape(group: int, block_n: int) -> tuple[int, int]:
    """(G_PAD, BLOCK_Q): rows padded to the 16-row tl.dot minimum.

    BLOCK_N and the cache block size are both powers of two, so the key tile is always a
    multiple or a divisor of a cache block.
    """
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    g_pad = triton.next_power_of_2(group)
    return g_pad, max(1, 16 // g_pad)


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
    min_tiles: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    table_ahead: bool | None = None,
    pdl: bool = False,
    kv_prefetch: bool = False,
) -> torch.Tensor:
    """Causal paged attention of a flat batch (see `engine.attention.reference.paged_attention`).

    The keyword-only tuning the engine leaves at None (the benchmark and the tests compare
    configurations) overrides one field of `triton_config.choose_config`'s launch for these
    shapes. `pdl` True asks for programmatic dependent launch, which is used only where
    `pdl_available` (else the plain launch runs); `kv_prefetch` (with PDL) asks L2 for each
    program's first PREFETCH_KEYS keys before it waits on the previous kernel, where
    `kv_prefetch_fits`.
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
    cfg = resolve_config(
        tokens=t, kv_heads=kvh, group=group, head_dim=d, elem_size=k_cache.element_size(),
        device=q.device, num_splits=num_splits, min_tiles=min_tiles, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages, table_ahead=table_ahead,
    )
    g_pad, block_q = _tile_shape(group, cfg.block_n)
    if cfg.num_splits > 1:
        part_acc = torch.empty((cfg.num_splits, t, h, d), dtype=torch.float32, device=q.device)
        part_ml = torch.empty((cfg.num_splits, t, h, 2), dtype=torch.float32, device=q.device)
        sem = _semaphores(q.device, t * kvh)
    else:
        part_acc = part_ml = out  # never touched: one split writes out directly
        sem = token_req
    use_pdl = pdl and pdl_available(q.device)
    launch = {"launch_pdl": True} if use_pdl else {}
    prefetch = kv_prefetch and kv_prefetch_fits(t, kvh, d, k_cache.element_size())
    _paged_attention_kernel[(t, kvh, cfg.num_splits)](
        q, k_cache, v_cache, block_tables, token_req, token_pos, out, part_acc, part_ml, sem,
        t, block_tables.shape[1], cfg.num_splits, cfg.min_tiles,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_cache.stride(3),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), v_cache.stride(3),
        block_tables.stride(0), block_tables.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        scale * LOG2E,
        sliding_window if sliding_window is not None else 0,
        H=h, G=group, G_PAD=g_pad, BLOCK_Q=block_q, D=d, BLOCK_SIZE=block_size,
        BLOCK_N=cfg.block_n, HAS_WINDOW=sliding_window is not None,
        IEEE_DOT=q.dtype == torch.float32, USE_PDL=(2 if prefetch else 1) if use_pdl else 0,
        TABLE_AHEAD=cfg.table_ahead,
        SPLIT=cfg.num_splits > 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **launch,
    )
    return out


def resolve_config(
    *, tokens: int, kv_heads: int, group: int, head_dim: int, elem_size: int,
    device: torch.device, num_splits: int | None = None, min_tiles: int | None = None,
    block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
    table_ahead: bool | None = None,
) -> LaunchConfig:
    """The default launch for these shapes with the given fields overridden (and checked)."""
    cfg = choose_config(
        tokens=tokens, kv_heads=kv_heads, head_dim=head_dim, elem_size=elem_size, device=device
    )
    cfg = cfg._replace(**{
        k: v for k, v in (("num_splits", num_splits), ("min_tiles", min_tiles),
                          ("block_n", block_n), ("num_warps", num_warps),
                          ("num_stages", num_stages), ("table_ahead", table_ahead))
        if v is not None
    })
    if cfg.num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {cfg.num_splits}")
    if cfg.min_tiles < 1:
        raise ValueError(f"min_tiles must be >= 1, got {cfg.min_tiles}")
    _tile_shape(group, cfg.block_n)  # validates block_n
    return cfg
