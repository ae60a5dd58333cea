"""Our paged attention, plugged into transformers' modeling code via AttentionInterface.

Owns: the per-step AttnContext (static tensors that describe the flat batch, so a CUDA
graph can capture the step), writing each layer's new K/V into the paged cache, and
dispatching to a backend (torch reference or Triton). The model is loaded with
attn_implementation=ATTN_IMPLEMENTATION; its modeling code passes our context through the
forward's keyword arguments (`gapless=ctx`), so there is no global state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

ATTN_IMPLEMENTATION = "gapless_paged"

Backend = Callable[..., torch.Tensor]


@dataclass(slots=True)
class AttnContext:
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer [blocks, block, kvh, d]
    slot_mapping: torch.Tensor  # [T] int64, flat cache slot of each token's K/V
    block_tables: torch.Tensor  # [R, max_blocks] int32
    token_req: torch.Tensor  # [T] int32, row of block_tables; -1 = padding
    token_pos: torch.Tensor  # [T] int32, absolute positions
    backend: Backend


def gapless_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    ctx = kwargs.get("gapless")
    if not isinstance(ctx, AttnContext):
        raise RuntimeError(
            f"attn_implementation={ATTN_IMPLEMENTATION!r} runs only inside the gapless engine "
            "(no AttnContext was passed to the model's forward)"
        )
    if kwargs.get("softcap") is not None:
        raise NotImplementedError("gapless paged attention does not support logit softcapping")
    # transformers hands us [batch=1, heads, T, head_dim]; the flat batch lives in T.
    q = query[0].transpose(0, 1)
    k = key[0].transpose(0, 1)
    v = value[0].transpose(0, 1)
    k_cache, v_cache = ctx.kv_caches[module.layer_idx]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, v.to(v_cache.dtype))
    scale = scaling if scaling is not None else head_dim**-0.5
    window = kwargs.get("sliding_window")
    out = ctx.backend(
        q,
        k_cache,
        v_cache,
        ctx.block_tables,
        ctx.token_req,
        ctx.token_pos,
        scale=float(scale),
        sliding_window=int(window) if window else None,
    )
    return out.unsqueeze(0), None


def register() -> None:
    """Register our attention (and 'no mask needed') with transformers; idempotent."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, gapless_attention)


def resolve_backend(name: str, device: torch.device) -> tuple[str, Backend]:
    """'auto' picks Triton on CUDA when it imports, the torch reference otherwise."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_importable() else "torch"
    if name == "triton":
        if device.type != "cuda":
            raise ValueError(
                "attention_backend 'triton' needs device 'cuda'; use 'torch' or 'auto'"
            )
        from engine.attention.triton_paged import paged_attention as triton_attention

        return "triton", triton_attention
    from engine.attention.reference import paged_attention as ref_attention

    return "torch", ref_attention


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True
