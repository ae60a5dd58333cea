"""The qkv GEMM with rotary and the KV-cache write in its epilogue: one kernel a decode layer
fewer under `decode_layer: fused` (config key fused_rotary).

`fused_qkv_rope(h, add, qkv_weight, bias, norm=..., ...)` is, in one Triton kernel,

    RMSNorm(h [+ add]) @ qkv^T (+ bias) -> rotary on q and k -> q out [T, H, D],
    k and v written into the paged caches at slot_mapping

what the fused layer otherwise does in two: the fused GEMM with its norm prologue
(engine/model/fused_gemm.py) writing qkv [T, (H + 2 KVH) D], then `rope_and_cache`
(engine/model/fused_ops.py) reading it back. Rotary pairs column d of a head with column
d + D/2, so each program owns BLOCK_N "half columns" j (head j // (D/2), offset d = j % (D/2))
and accumulates the two halves side by side (acc_lo for the columns head*D + d, acc_hi for
head*D + D/2 + d; the same two-accumulator K loop as gate_up's SiLU*up, `_mainloop`). Rotary is
then elementwise on the fp32 accumulators, and a tile may hold parts of several heads of any
kind (q, k, v; GQA), any head_dim, N and K not multiples of the tiles: the column mapping is
per column, the stores are masked per kind. A config's block_n counts output columns (two per
half column). tl.dot needs 16 columns per accumulator, so block_n 16 (8 pairs: twice the
programs at SmolLM2's N = 960) runs one accumulator with each pair's halves side by side and
splits it after the K loop (tl.reshape + tl.split); block_n >= 32 runs one per half.

Rounding as rope_and_cache: the GEMM output rounded to the dtype (bias added in fp32 first),
every rotary product rounded to the dtype, the sum rounded once at the store. Models with a
per-head q/k RMSNorm (Qwen3) keep the two kernels (`rope_epilogue_fits`).

The torch twin `fused_qkv_rope_torch` is the CPU path and the oracle of the tests.
"""

from __future__ import annotations

import torch

from engine.model.fused_gemm import fused_linear_torch
from engine.model.fused_ops import rope_and_cache_torch, tl, triton, use_triton
from engine.model.gemm_table import GemmConfig, heuristic_config
from engine.model.pdl_launch import pdl_launch

if triton is not None:
    from engine.model.fused_gemm import _blocks, _mainloop

    @triton.jit(do_not_specialize=["M", "H", "KVH"])
    def _fused_linear_rope_kernel(
        h_ptr, nw_ptr, w_ptr, b_ptr, a_ptr, s_ptr, cs_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr,
        v_ptr, M, N2, K, H, KVH, eps,
        stride_h, stride_w, stride_a, stride_s, stride_cs, stride_q,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        HALF: tl.constexpr, CACHE_BLOCK: tl.constexpr, NORM: tl.constexpr,
        ADD_IN: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BK: tl.constexpr,
        USE_GDC: tl.constexpr, INTERLEAVE: tl.constexpr, PF_K: tl.constexpr,
    ):
        """N2 = (H + 2 KVH) * HALF half columns; BLOCK_N of them per program (see the module
        docstring). Heads 0..H-1 are q (rotated, to q_ptr), H..H+KVH-1 k (rotated, to the k
        cache), the rest v (to the v cache). INTERLEAVE: one accumulator of 2 BLOCK_N columns,
        each pair's two halves side by side, split after the K loop (for BLOCK_N 8: tl.dot
        needs 16 columns); else one accumulator per half."""
        _qkv_rope_tile(
            tl.program_id(0), tl.program_id(1), h_ptr, nw_ptr, w_ptr, b_ptr, a_ptr, s_ptr,
            cs_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, M, N2, K, H, KVH, eps,
            stride_h, stride_w, stride_a, stride_s, stride_cs, stride_q,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
            HALF, CACHE_BLOCK, NORM, ADD_IN, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, NORM_BK,
            USE_GDC, INTERLEAVE, PF_K)

    @triton.jit
    def _qkv_rope_tile(
        pid_m, pid_n, h_ptr, nw_ptr, w_ptr, b_ptr, a_ptr, s_ptr, cs_ptr, pos_ptr, slot_ptr,
        q_ptr, k_ptr, v_ptr, M, N2, K, H, KVH, eps,
        stride_h, stride_w, stride_a, stride_s, stride_cs, stride_q,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        HALF: tl.constexpr, CACHE_BLOCK: tl.constexpr, NORM: tl.constexpr,
        ADD_IN: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BK: tl.constexpr,
        USE_GDC: tl.constexpr, INTERLEAVE: tl.constexpr, PF_K: tl.constexpr = 0,
    ):
        """The tile (pid_m, pid_n) of `_fused_linear_rope_kernel`."""
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = rm < M
        n_mask = j < N2
        head = j // HALF
        d = j % HALF
        col = head * (2 * HALF) + d  # the first-half column of the qkv output
        if INTERLEAVE:  # column c: pair c // 2, half c % 2
            ci = tl.arange(0, 2 * BLOCK_N)
            jc = pid_n * BLOCK_N + ci // 2
            rows = (jc // HALF) * (2 * HALF) + jc % HALF + (ci % 2) * HALF
            acc, _ = _mainloop(
                h_ptr, a_ptr, s_ptr, nw_ptr, w_ptr + rows[None, :].to(tl.int64) * stride_w, 0,
                rm, m_mask, jc < N2, pid_n, K, eps, stride_h, stride_a, stride_s, NORM, False,
                ADD_IN, BLOCK_M, 2 * BLOCK_N, BLOCK_K, NORM_BK, USE_GDC, PF_K)
            if HAS_BIAS:
                acc += tl.load(b_ptr + rows, mask=jc < N2, other=0.0).to(tl.float32)[None, :]
            acc_lo, acc_hi = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        else:
            w_cols = w_ptr + col[None, :].to(tl.int64) * stride_w
            acc_lo, acc_hi = _mainloop(
                h_ptr, a_ptr, s_ptr, nw_ptr, w_cols, HALF * stride_w, rm, m_mask, n_mask,
                pid_n, K, eps, stride_h, stride_a, stride_s, NORM, True, ADD_IN, BLOCK_M,
                BLOCK_N, BLOCK_K, NORM_BK, USE_GDC, PF_K)
            if HAS_BIAS:
                acc_lo += tl.load(b_ptr + col, mask=n_mask, other=0.0).to(tl.float32)[None, :]
                acc_hi += tl.load(b_ptr + col + HALF, mask=n_mask,
                                  other=0.0).to(tl.float32)[None, :]
        dt = q_ptr.dtype.element_ty
        x1 = acc_lo.to(dt).to(tl.float32)
        x2 = acc_hi.to(dt).to(tl.float32)
        mask = m_mask[:, None] & n_mask[None, :]
        pos = tl.load(pos_ptr + rm, mask=m_mask, other=0).to(tl.int64)
        cs = cs_ptr + pos[:, None] * stride_cs + d[None, :]
        c = tl.load(cs, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(cs + HALF, mask=mask, other=0.0).to(tl.float32)
        # q * cos + rotate_half(q) * sin with every product rounded to the dtype first
        o1 = (x1 * c).to(dt).to(tl.float32) - (x2 * s).to(dt).to(tl.float32)
        o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
        is_q = head < H
        is_v = head >= H + KVH
        is_k = (head >= H) & (head < H + KVH)
        qd = q_ptr + rm[:, None].to(tl.int64) * stride_q + col[None, :]
        tl.store(qd, o1.to(dt), mask=mask & is_q[None, :])
        tl.store(qd + HALF, o2.to(dt), mask=mask & is_q[None, :])
        slot = tl.load(slot_ptr + rm, mask=m_mask, other=0).to(tl.int64)
        blk = slot // CACHE_BLOCK
        off = slot % CACHE_BLOCK
        kd = k_ptr + (blk * stride_kb + off * stride_ks)[:, None] \
            + ((head - H) * stride_kh + d)[None, :]
        tl.store(kd, o1.to(k_ptr.dtype.element_ty), mask=mask & is_k[None, :])
        tl.store(kd + HALF, o2.to(k_ptr.dtype.element_ty), mask=mask & is_k[None, :])
        vd = v_ptr + (blk * stride_vb + off * stride_vs)[:, None] \
            + ((head - H - KVH) * stride_vh + d)[None, :]
        tl.store(vd, x1.to(v_ptr.dtype.element_ty), mask=mask & is_v[None, :])
        tl.store(vd + HALF, x2.to(v_ptr.dtype.element_ty), mask=mask & is_v[None, :])


def rope_epilogue_fits(qk_norm: torch.Tensor | None, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, cos_sin: torch.Tensor) -> bool:
    """The shapes the epilogue handles: no per-head q/k norm, an even head_dim, caches and the
    cos/sin table contiguous along the head dimension."""
    d = k_cache.shape[-1]
    return (qk_norm is None and d % 2 == 0 and k_cache.stride(-1) == 1
            and v_cache.stride(-1) == 1 and cos_sin.is_contiguous())


def fused_qkv_rope_torch(
    h: torch.Tensor, add: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
    *, norm: torch.Tensor | None, eps: float, cos_sin: torch.Tensor, positions: torch.Tensor,
    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The oracle: (q [T, H, D], h + add or None), k and v written into the caches."""
    x = h if add is None else add + h
    qkv = fused_linear_torch(x, weight, bias, norm=norm, eps=eps)
    q = rope_and_cache_torch(qkv, cos_sin, positions, slot_mapping, k_cache, v_cache,
                             num_heads)
    return q, (None if add is None else x)


def fused_qkv_rope(
    h: torch.Tensor, add: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None,
    *, norm: torch.Tensor | None, eps: float, cos_sin: torch.Tensor, positions: torch.Tensor,
    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
    config: GemmConfig | None = None, pdl: bool = False, overlap: str = "late",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One kernel: RMSNorm(h [+ add]) (norm None: h as is), the qkv GEMM, rotary, the K/V cache
    write. Returns (q [T, H, D], the sum h + add when add is given, else None). config: tiles
    (block_n output columns, >= 16; None: the table's heuristic); pdl: programmatic
    dependent launch where supported, overlapping as `overlap` says (engine/model/pdl_launch.py)."""
    kw = dict(norm=norm, eps=eps, cos_sin=cos_sin, positions=positions,
              slot_mapping=slot_mapping, k_cache=k_cache, v_cache=v_cache, num_heads=num_heads)
    if not use_triton(h):
        return fused_qkv_rope_torch(h, add, weight, bias, **kw)
    h = h if h.stride(-1) == 1 else h.contiguous()
    m, k = h.shape
    n = weight.shape[0]
    cache_block, kvh, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if d % 2 or n != (num_heads + 2 * kvh) * d:
        raise ValueError(f"qkv weight rows {n} != (H {num_heads} + 2 KVH {kvh}) * D {d} "
                         "or odd head_dim")
    q = torch.empty((m, num_heads, d), dtype=h.dtype, device=h.device)
    x_sum = torch.empty_like(h) if add is not None else None
    if m == 0:
        return q, x_sum
    cfg = config or heuristic_config(n, k)
    if cfg.block_n < 16:
        raise ValueError(f"the rotary epilogue needs block_n >= 16, got {cfg}")
    block_m, half_cols = _blocks(m)[0], cfg.block_n // 2
    grid = (triton.cdiv(m, block_m), triton.cdiv(n // 2, half_cols))
    a = add if add is not None else h
    s = x_sum if x_sum is not None else h
    gdc, pf_k, extra = pdl_launch(pdl, overlap, h, n, k, weight.element_size())
    _fused_linear_rope_kernel[grid](
        h, norm if norm is not None else weight, weight, bias if bias is not None else weight,
        a, s, cos_sin, positions, slot_mapping, q, k_cache, v_cache,
        m, n // 2, k, num_heads, kvh, eps,
        h.stride(0), weight.stride(0), a.stride(0), s.stride(0), cos_sin.stride(0),
        q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HALF=d // 2, CACHE_BLOCK=cache_block, NORM=norm is not None, ADD_IN=add is not None,
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=half_cols, BLOCK_K=cfg.block_k,
        NORM_BK=min(8192 // block_m, triton.next_power_of_2(k)), USE_GDC=gdc, PF_K=pf_k,
        INTERLEAVE=cfg.block_n == 16, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
    )
    return q, x_sum
