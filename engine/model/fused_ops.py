"""The fused elementwise ops of the Llama-family forward: a Triton path and a torch path.

Owns three ops, each with a Triton kernel (CUDA, or the interpreter in tests) and a plain torch
twin (the CPU path and the oracle the kernels are tested against):

- `add_rms_norm`: residual add fused with RMSNorm (one read of x and residual, one write of
  the new residual and of the normed activations).
- `rope_and_cache`: from the fused QKV projection of a flat batch, optional per-head q/k
  RMSNorm (Qwen3), rotary embedding of q and k (rotate-half convention, cos/sin read from a
  table), the write of k and v into the paged cache at `slot_mapping`, and q out: one kernel.
- `silu_and_mul`: SiLU(gate) * up from the fused gate_up projection.

Rounding follows transformers' modeling code step by step (each bf16 op rounds to bf16), so
greedy output in 16-bit dtypes stays the same as `generate`'s where the logits are distinct.

Why our own kernels and not FlashInfer's or Liger's: both ship these ops, but the GPU machine
has no network (a wheel must be carried, FlashInfer's JIT cache with it), CI has no GPU, and
neither fuses the paged-cache write of *our* cache layout with rotary. Three ~40-line
Triton kernels tested under the interpreter cost less than a carried dependency.

Never allocates per-value buffers, branches on tensor contents, or syncs with the host: the
model's forward is captured in CUDA graphs.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - torch-only installs take the torch path
    triton = None
    tl = None


# Triton reads TRITON_INTERPRET when a kernel is defined (this module's import), so read once.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def use_triton(x: torch.Tensor) -> bool:
    """Triton on CUDA tensors, and on CPU tensors only under TRITON_INTERPRET=1 (tests)."""
    if triton is None:
        return False
    return x.is_cuda or _INTERPRET


# ------------------------------------------------------------------------------ torch path


def add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); residual None means no add."""
    h = x if residual is None else residual + x
    y = h.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(h.dtype), h


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rope_and_cache_torch(
    qkv: torch.Tensor,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    qk_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """qkv [T, (H + 2 KVH) * D]; cos_sin [max_pos, 2, D/2] in the model dtype; qk_norm
    [2, D] (q's then k's per-head RMSNorm weight) or None; writes K/V into the caches at
    slot_mapping [T] (int64); returns q [T, H, D] (rotated)."""
    t = qkv.shape[0]
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    q, k, v = qkv.view(t, num_heads + 2 * kvh, d).split([num_heads, kvh, kvh], dim=1)
    if qk_norm is not None:
        q, _ = add_rms_norm_torch(q, None, qk_norm[0], eps)
        k, _ = add_rms_norm_torch(k, None, qk_norm[1], eps)
    cs = cos_sin[positions.long()]  # [T, 2, D/2]
    cos, sin = cs[:, None, 0], cs[:, None, 1]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))
    return q.contiguous()


def silu_and_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ----------------------------------------------------------------------------- triton path

if triton is not None:

    @triton.jit
    def _add_rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, N, eps,
        stride_x, stride_r, stride_o, stride_ro,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < N
        h = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
            h = (h.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + row * stride_ro + offs, h, mask=mask)
        hf = h.to(tl.float32)
        var = tl.sum(hf * hf, axis=0) / N
        y = (hf * tl.rsqrt(var + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride_o + offs, (y * w).to(out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _rope_and_cache_kernel(
        qkv_ptr, cs_ptr, pos_ptr, slot_ptr, k_ptr, v_ptr, q_out_ptr, qkn_ptr,
        eps, stride_qkv, stride_cs, stride_qo,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        H: tl.constexpr, KVH: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, HAS_NORM: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        j = tl.program_id(1)  # 0..H-1: q heads, H..H+KVH-1: k heads, then v heads
        offs = tl.arange(0, HALF_PAD)
        m = offs < HALF
        base = qkv_ptr + t * stride_qkv + j * (2 * HALF)
        x1 = tl.load(base + offs, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + offs, mask=m, other=0.0).to(tl.float32)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        blk = slot // BLOCK_SIZE
        off = slot % BLOCK_SIZE
        if j >= H + KVH:
            kv = j - H - KVH
            dst = v_ptr + blk * stride_vb + off * stride_vs + kv * stride_vh
            tl.store(dst + offs, x1.to(v_ptr.dtype.element_ty), mask=m)
            tl.store(dst + HALF + offs, x2.to(v_ptr.dtype.element_ty), mask=m)
        else:
            if HAS_NORM:
                var = (tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / (2 * HALF)
                r = tl.rsqrt(var + eps)
                nw = qkn_ptr + (j >= H).to(tl.int32) * (2 * HALF)  # row 0: q, row 1: k
                w1 = tl.load(nw + offs, mask=m, other=0.0).to(tl.float32)
                w2 = tl.load(nw + HALF + offs, mask=m, other=0.0).to(tl.float32)
                # weight * (x * r).to(dtype), as transformers' RMSNorm rounds
                x1 = ((x1 * r).to(q_out_ptr.dtype.element_ty).to(tl.float32) * w1).to(
                    q_out_ptr.dtype.element_ty).to(tl.float32)
                x2 = ((x2 * r).to(q_out_ptr.dtype.element_ty).to(tl.float32) * w2).to(
                    q_out_ptr.dtype.element_ty).to(tl.float32)
            pos = tl.load(pos_ptr + t).to(tl.int64)
            c = tl.load(cs_ptr + pos * stride_cs + offs, mask=m, other=0.0).to(tl.float32)
            s = tl.load(cs_ptr + pos * stride_cs + HALF + offs, mask=m, other=0.0).to(tl.float32)
            # q * cos + rotate_half(q) * sin with every product rounded to the dtype first
            x1c = (x1 * c).to(q_out_ptr.dtype.element_ty).to(tl.float32)
            x2s = (x2 * s).to(q_out_ptr.dtype.element_ty).to(tl.float32)
            x2c = (x2 * c).to(q_out_ptr.dtype.element_ty).to(tl.float32)
            x1s = (x1 * s).to(q_out_ptr.dtype.element_ty).to(tl.float32)
            o1 = x1c - x2s
            o2 = x2c + x1s
            if j < H:
                dst = q_out_ptr + t * stride_qo + j * (2 * HALF)
                tl.store(dst + offs, o1.to(q_out_ptr.dtype.element_ty), mask=m)
                tl.store(dst + HALF + offs, o2.to(q_out_ptr.dtype.element_ty), mask=m)
            else:
                kv = j - H
                dst = k_ptr + blk * stride_kb + off * stride_ks + kv * stride_kh
                tl.store(dst + offs, o1.to(k_ptr.dtype.element_ty), mask=m)
                tl.store(dst + HALF + offs, o2.to(k_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _silu_and_mul_kernel(gu_ptr, out_ptr, N, stride_gu, stride_o, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < N
        g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + row * stride_gu + N + offs, mask=mask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + row * stride_o + offs, (act * u).to(out_ptr.dtype.element_ty),
                 mask=mask)


@functools.cache
def _norm_warps(block: int) -> int:
    return max(1, min(16, block // 256))


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as `add_rms_norm_torch`; the new residual is written into `residual` in place."""
    t, n = x.shape
    out = torch.empty_like(x)
    res_out = residual if residual is not None else x
    if t == 0:
        return out, res_out
    block = triton.next_power_of_2(n)
    r = residual if residual is not None else x
    _add_rms_norm_kernel[(t,)](
        x, r, weight, out, res_out, n, eps,
        x.stride(0), r.stride(0), out.stride(0), res_out.stride(0),
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_norm_warps(block),
    )
    return out, res_out


def rope_and_cache_triton(
    qkv: torch.Tensor,
    cos_sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    qk_norm: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Same as `rope_and_cache_torch`, one launch of (T, H + 2 KVH) programs."""
    t = qkv.shape[0]
    block_size, kvh, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if d % 2:
        raise ValueError(f"head_dim must be even for rotary embeddings, got {d}")
    assert qkv.stride(1) == 1 and cos_sin.is_contiguous() and k_cache.stride(3) == 1
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t == 0:
        return q
    has_norm = qk_norm is not None
    qkn = qk_norm if has_norm else cos_sin  # unread without a norm
    _rope_and_cache_kernel[(t, num_heads + 2 * kvh)](
        qkv, cos_sin, positions, slot_mapping, k_cache, v_cache, q, qkn,
        eps, qkv.stride(0), cos_sin.stride(0), q.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        H=num_heads, KVH=kvh, HALF=d // 2, HALF_PAD=triton.next_power_of_2(d // 2),
        BLOCK_SIZE=block_size, HAS_NORM=has_norm,
        num_warps=1,
    )
    return q


def silu_and_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    t, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    if t == 0:
        return out
    block = min(1024, triton.next_power_of_2(n))
    _silu_and_mul_kernel[(t, triton.cdiv(n, block))](
        gate_up, out, n, gate_up.stride(0), out.stride(0), BLOCK=block, num_warps=4,
    )
    return out


# ------------------------------------------------------------------------------- dispatch


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x):
        return add_rms_norm_triton(x, residual, weight, eps)
    return add_rms_norm_torch(x, residual, weight, eps)


def rope_and_cache(qkv: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    if use_triton(qkv):
        return rope_and_cache_triton(qkv, *args, **kwargs)  # type: ignore[arg-type]
    return rope_and_cache_torch(qkv, *args, **kwargs)  # type: ignore[arg-type]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if use_triton(gate_up):
        return silu_and_mul_triton(gate_up)
    return silu_and_mul_torch(gate_up)
