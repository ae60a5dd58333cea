"""Decode-shape GEMMs with the ops around them fused in: fewer kernels per layer.

`fused_linear` is the kernel of the fused decode layer: an RMSNorm prologue, the GEMM, a
SiLU*up or residual-add epilogue; each program owns BLOCK_N output columns for all K (no
split-K, so no reduce kernel). With SiLU*up (`pair`) the weight is the fused [2I, H] gate_up
(gate rows first, up rows after, as the loader concatenates them): each program accumulates
the gate and up dot products side by side in fp32 and writes only the [T, I] product, where
cuBLAS + `silu_and_mul` would write the [T, 2I] activations and read them back.
`fused_add_norm_linear` also does the residual add a cuBLAS GEMM left pending, in the prologue.
Its tile configuration per shape comes from engine/model/gemm_table.py (measured by `python -m
bench fused-sweep`); with `pdl` it is launched with programmatic dependent launch, its first
weight tiles asked of L2 before it waits on the previous kernel.

Rounding: the gate and up accumulators are rounded to the activation dtype before the SiLU, as
transformers' two separate projections do; the product is computed in fp32 and rounded once
(transformers rounds SiLU(gate) to the dtype first, so in bf16 the last bit may differ; the fp32
tests are exact up to summation order).

Selected by the config key `decode_layer` (engine.model.llama.FusedPath; the torch twins are
the oracle and the CPU path). Its prologue and K loop (`_mainloop`) are shared with the qkv GEMM
that does rotary and the KV write in its epilogue (engine/model/fused_rope.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.l2_prefetch import prefetch_lines
from engine.model.fused_ops import tl, triton, use_triton
from engine.model.gemm_table import GemmConfig, heuristic_config
from engine.model.pdl_launch import pdl_launch


def gate_up_silu_torch(
    h: torch.Tensor, gate_up: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """SiLU(gate) * up of F.linear(h, gate_up, bias): the oracle and the CPU path."""
    gu = F.linear(h, gate_up, bias)
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up


def _blocks(m: int) -> tuple[int, int, int]:
    """Decode shapes: M is the batch (1..256); tl.dot needs every block >= 16."""
    block_m = 16 if m <= 16 else (32 if m <= 32 else 64)
    return block_m, 64, 64


if triton is not None:

    @triton.jit
    def _rows(h_rows, a_rows, kk, m_mask, K, ADD_IN: tl.constexpr):
        """Rows x kk of h and (ADD_IN) of the pending residual, raw: issued one step ahead of
        their use by the norm loops, so their latency hides behind the current step."""
        mask = m_mask[:, None] & (kk < K)[None, :]
        h = tl.load(h_rows + kk[None, :], mask=mask, other=0.0)
        r = h
        if ADD_IN:
            r = tl.load(a_rows + kk[None, :], mask=mask, other=0.0)
        return h, r

    @triton.jit
    def _normed(h, r, nw, rstd, ADD_IN: tl.constexpr):
        """(h + r if ADD_IN), RMS-normalised and * nw, rounded like add_rms_norm."""
        a = h
        if ADD_IN:
            a = (h.to(tl.float32) + r.to(tl.float32)).to(h.dtype)
        y = (a.to(tl.float32) * rstd[:, None]).to(a.dtype)
        return (y.to(tl.float32) * nw.to(tl.float32)[None, :]).to(y.dtype)

    @triton.jit
    def _a_tile(h_rows, a_rows, nw_ptr, kk, m_mask, rstd, K, NORM: tl.constexpr,
                ADD_IN: tl.constexpr):
        """Rows x kk of h (+ the pending residual, ADD_IN), RMS-normalised (NORM) and rounded
        like add_rms_norm: the sum to the dtype, the normed row to the dtype, then * weight."""
        k_mask = kk < K
        a = tl.load(h_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        if ADD_IN:
            r = tl.load(a_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            a = (a.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
        if NORM:
            nw = tl.load(nw_ptr + kk, mask=k_mask, other=0.0).to(tl.float32)
            y = (a.to(tl.float32) * rstd[:, None]).to(a.dtype)
            a = (y.to(tl.float32) * nw[None, :]).to(y.dtype)
        return a

    @triton.jit
    def _prefetch_rows(cols, K, n_mask, LINES: tl.constexpr = 8):
        """Ask L2 for the weight rows `cols` ([1, BLOCK_N] pointers, K elements each), one
        prefetch per 128-byte line, LINES lines a row at a time."""
        line: tl.constexpr = 1024 // cols.dtype.element_ty.primitive_bitwidth
        for k0 in range(0, K, line * LINES):
            kk = k0 + tl.arange(0, LINES) * line
            prefetch_lines(cols + tl.where((kk < K)[:, None] & n_mask[None, :], kk[:, None], 0))

    @triton.jit
    def _mainloop(
        h_ptr, a_ptr, s_ptr, nw_ptr, w_cols, u_off, rm, m_mask, n_mask, pid_n, K, eps,
        stride_h, stride_a, stride_s,
        NORM: tl.constexpr, TWO: tl.constexpr, ADD_IN: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_BK: tl.constexpr,
        USE_GDC: tl.constexpr, PF_K: tl.constexpr,
    ):
        """The prologue and the K loop of the fused kernels: (acc_g, acc_u) in fp32, acc_g =
        prologue(h) @ W[cols]^T for the weight rows w_cols ([1, BLOCK_N] pointers), acc_u (TWO)
        the same for the rows u_off elements further (the up half of a gate_up weight, or the
        second half of each rotary head). RMSNorm prologue (NORM), of h + a (ADD_IN, the
        residual add a cuBLAS GEMM left pending; the programs of the first N tile write that sum
        to s, as add_rms_norm does). USE_GDC (0: no PDL; `pdl_launch`): launched with
        programmatic dependent launch: the first weight tile loaded, then wait for the previous
        kernel before reading h (the weights do not depend on it); 1 lets the next kernel launch
        once the K loop is done, 2 as soon as the wait is over (so that kernel's weight loads
        overlap this one's K loop; at most two kernels are resident, as the next one triggers
        only after its own wait). PF_K > 0 (with USE_GDC): before the wait, ask L2 for the
        first PF_K columns of the program's weight rows (`prefetch_k` bounds the bytes)."""
        rk = tl.arange(0, BLOCK_K)
        h_rows = h_ptr + rm[:, None].to(tl.int64) * stride_h
        a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_a
        # The first weight tile does not depend on the previous kernel: loaded before the wait,
        # it overlaps that kernel's tail under PDL (the K loop below starts at the second tile).
        wmask = (rk < K)[:, None] & n_mask[None, :]
        wg = tl.load(w_cols + rk[:, None], mask=wmask, other=0.0)
        wu = wg
        if TWO:
            wu = tl.load(w_cols + u_off + rk[:, None], mask=wmask, other=0.0)
        if USE_GDC and PF_K > 0:  # the first PF_K columns of its weight rows asked of L2
            _prefetch_rows(w_cols, PF_K, n_mask)
            if TWO:
                _prefetch_rows(w_cols + u_off, PF_K, n_mask)
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
            if USE_GDC >= 2:  # the next kernel may start its own weight loads now
                tl.extra.cuda.gdc_launch_dependents()
        rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if NORM:  # first pass over the rows (small at decode): the RMS of each row
            ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
            rnk = tl.arange(0, NORM_BK)
            h_next, r_next = _rows(h_rows, a_rows, rnk, m_mask, K, ADD_IN)
            for k0 in range(0, K, NORM_BK):
                kk = k0 + rnk
                a, r = h_next, r_next
                h_next, r_next = _rows(h_rows, a_rows, kk + NORM_BK, m_mask, K, ADD_IN)
                if ADD_IN:
                    a = (a.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
                    if pid_n == 0:
                        tl.store(s_ptr + rm[:, None].to(tl.int64) * stride_s + kk[None, :], a,
                                 mask=m_mask[:, None] & (kk < K)[None, :])
                a = a.to(tl.float32)
                ss += tl.sum(a * a, axis=1)
            rstd = tl.rsqrt(ss / K + eps)
        a = _a_tile(h_rows, a_rows, nw_ptr, rk, m_mask, rstd, K, NORM, ADD_IN)
        acc_g = tl.dot(a, wg, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32))
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TWO:
            acc_u = tl.dot(a, wu, acc_u)
        if NORM:  # the activation tile is loaded one step ahead (the normalisation between
            # its load and the dot keeps Triton's pipeliner from prefetching it)
            h_next, r_next = _rows(h_rows, a_rows, BLOCK_K + rk, m_mask, K, ADD_IN)
            nw_next = tl.load(nw_ptr + BLOCK_K + rk, mask=BLOCK_K + rk < K, other=0.0)
            for k0 in range(BLOCK_K, K, BLOCK_K):
                kk = k0 + rk
                h, r, nw = h_next, r_next, nw_next
                h_next, r_next = _rows(h_rows, a_rows, kk + BLOCK_K, m_mask, K, ADD_IN)
                nw_next = tl.load(nw_ptr + kk + BLOCK_K, mask=kk + BLOCK_K < K, other=0.0)
                a = _normed(h, r, nw, rstd, ADD_IN)
                wmask = (kk < K)[:, None] & n_mask[None, :]
                wg = tl.load(w_cols + kk[:, None], mask=wmask, other=0.0)
                acc_g = tl.dot(a, wg, acc_g)
                if TWO:
                    wu = tl.load(w_cols + u_off + kk[:, None], mask=wmask, other=0.0)
                    acc_u = tl.dot(a, wu, acc_u)
        else:
            for k0 in range(BLOCK_K, K, BLOCK_K):
                kk = k0 + rk
                a = tl.load(h_rows + kk[None, :], mask=m_mask[:, None] & (kk < K)[None, :],
                            other=0.0)
                wmask = (kk < K)[:, None] & n_mask[None, :]
                wg = tl.load(w_cols + kk[:, None], mask=wmask, other=0.0)
                acc_g = tl.dot(a, wg, acc_g)
                if TWO:
                    wu = tl.load(w_cols + u_off + kk[:, None], mask=wmask, other=0.0)
                    acc_u = tl.dot(a, wu, acc_u)
        if USE_GDC == 1:
            tl.extra.cuda.gdc_launch_dependents()
        return acc_g, acc_u

    @triton.jit(do_not_specialize=["M"])
    def _fused_linear_kernel(
        h_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, out_ptr, a_ptr, s_ptr, M, N, K, eps,
        stride_h, stride_w, stride_r, stride_o, stride_a, stride_s,
        NORM: tl.constexpr, PAIR: tl.constexpr, RESIDUAL: tl.constexpr, ADD_IN: tl.constexpr,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, NORM_BK: tl.constexpr, USE_GDC: tl.constexpr,
        PF_K: tl.constexpr,
    ):
        """out = epilogue(prologue(h) @ W^T): RMSNorm prologue (NORM, of h + a with ADD_IN;
        see _mainloop), SiLU(gate)*up of a fused [2N, K] weight (PAIR), residual add
        (RESIDUAL). One pass over K per program, each program owns BLOCK_N output columns
        (no split-K, so no reduce kernel)."""
        _linear_tile(
            tl.program_id(0), tl.program_id(1), h_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, out_ptr,
            a_ptr, s_ptr, M, N, K, eps, stride_h, stride_w, stride_r, stride_o, stride_a,
            stride_s, NORM, PAIR, RESIDUAL, ADD_IN, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K,
            NORM_BK, USE_GDC, PF_K)

    @triton.jit
    def _linear_tile(
        pid_m, pid_n, h_ptr, nw_ptr, w_ptr, b_ptr, r_ptr, out_ptr, a_ptr, s_ptr, M, N, K, eps,
        stride_h, stride_w, stride_r, stride_o, stride_a, stride_s,
        NORM: tl.constexpr, PAIR: tl.constexpr, RESIDUAL: tl.constexpr, ADD_IN: tl.constexpr,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, NORM_BK: tl.constexpr, USE_GDC: tl.constexpr,
        PF_K: tl.constexpr = 0,
    ):
        """The tile (pid_m, pid_n) of `_fused_linear_kernel`."""
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_mask = rm < M
        n_mask = rn < N
        w_cols = w_ptr + rn[None, :].to(tl.int64) * stride_w
        acc_g, acc_u = _mainloop(
            h_ptr, a_ptr, s_ptr, nw_ptr, w_cols, N * stride_w, rm, m_mask, n_mask, pid_n, K,
            eps, stride_h, stride_a, stride_s, NORM, PAIR, ADD_IN, BLOCK_M, BLOCK_N, BLOCK_K,
            NORM_BK, USE_GDC, PF_K)
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            if PAIR:
                acc_u += tl.load(b_ptr + N + rn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y = acc_g.to(out_ptr.dtype.element_ty).to(tl.float32)
        if PAIR:
            u = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
            y = y / (1.0 + tl.exp(-y)) * u
        if RESIDUAL:
            r = tl.load(r_ptr + rm[:, None].to(tl.int64) * stride_r + rn[None, :],
                        mask=m_mask[:, None] & n_mask[None, :], other=0.0)
            y = y + r.to(tl.float32)
        tl.store(out_ptr + rm[:, None].to(tl.int64) * stride_o + rn[None, :],
                 y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def fused_linear_torch(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    norm: torch.Tensor | None = None, eps: float = 1e-6, pair: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """The oracle of `fused_linear`: RMSNorm(h)*norm if norm, the linear, SiLU*up if pair,
    + residual if given."""
    if norm is not None:  # rounded like add_rms_norm
        hf = h.float()
        y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
        h = (y.float() * norm.float()).to(h.dtype)
    out = gate_up_silu_torch(h, weight, bias) if pair else F.linear(h, weight, bias)
    return out if residual is None else (out.float() + residual.float()).to(out.dtype)


def fused_linear(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    norm: torch.Tensor | None = None, eps: float = 1e-6, pair: bool = False,
    residual: torch.Tensor | None = None, config: GemmConfig | None = None, pdl: bool = False,
    overlap: str = "late",
) -> torch.Tensor:
    """One kernel: [RMSNorm prologue] GEMM [SiLU-and-mul | residual add epilogue].
    config: tiles and warps (engine.model.gemm_table; None: its heuristic); pdl: launch with
    programmatic dependent launch where the GPU and Triton support it (ignored elsewhere),
    overlapping its neighbours as `overlap` says (config key pdl_overlap, `pdl_launch`)."""
    if not use_triton(h):
        return fused_linear_torch(h, weight, bias, norm=norm, eps=eps, pair=pair,
                                  residual=residual)
    return _launch(h, None, weight, bias, norm, eps, pair, residual, config, pdl, overlap)[0]


def fused_add_norm_linear(
    h: torch.Tensor, add: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *,
    norm: torch.Tensor, eps: float, pair: bool = False, config: GemmConfig | None = None,
    pdl: bool = False, overlap: str = "late",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fused_linear(h + add, norm=norm, ...), h + add) in one kernel: the residual add a
    cuBLAS GEMM left pending, done in the prologue, as add_rms_norm does it."""
    if not use_triton(h):
        x = add + h
        return fused_linear_torch(x, weight, bias, norm=norm, eps=eps, pair=pair), x
    return _launch(h, add, weight, bias, norm, eps, pair, None, config, pdl, overlap)


def _launch(h, add, weight, bias, norm, eps, pair, residual, config, pdl, overlap):
    h = h if h.stride(-1) == 1 else h.contiguous()
    m, k = h.shape
    n = weight.shape[0] // 2 if pair else weight.shape[0]
    out = torch.empty((m, n), dtype=h.dtype, device=h.device)
    x_sum = torch.empty_like(h) if add is not None else None
    if m == 0:
        return out, x_sum
    cfg = config or heuristic_config(n, k)
    block_m = _blocks(m)[0]
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, cfg.block_n))
    r = residual if residual is not None else out
    a = add if add is not None else h
    s = x_sum if x_sum is not None else h
    gdc, pf_k, extra = pdl_launch(pdl, overlap, h, weight.shape[0], k, weight.element_size())
    _fused_linear_kernel[grid](
        h, norm if norm is not None else weight, weight, bias if bias is not None else weight,
        r, out, a, s, m, n, k, eps, h.stride(0), weight.stride(0), r.stride(0), out.stride(0),
        a.stride(0), s.stride(0),
        NORM=norm is not None, PAIR=pair, RESIDUAL=residual is not None,
        ADD_IN=add is not None, HAS_BIAS=bias is not None, BLOCK_M=block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NORM_BK=min(8192 // block_m, triton.next_power_of_2(k)),
        USE_GDC=gdc, PF_K=pf_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
    )
    return out, x_sum

