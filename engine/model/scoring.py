"""Scoring a token sequence (all next-token logits) through our paged attention.

Owns a one-request, eager forward pass over a model loaded by engine.model.loader: a fresh paged
cache, a block table, and the reference attention backend. For perplexity checks and tests;
serving never goes through here.
"""

from __future__ import annotations

import torch

from engine.attention.interface import AttnContext
from engine.attention.reference import paged_attention as ref_attention
from engine.model.hf_config import kv_cache_shape


@torch.inference_mode()
def sequence_logits(model: torch.nn.Module, token_ids: list[int], block_size: int = 16
                    ) -> torch.Tensor:
    """Logits [len(token_ids), vocab] of each position's next token."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    n = len(token_ids)
    layers, kv_heads, head_dim = kv_cache_shape(model.config)
    blocks = -(-n // block_size)
    shape = (blocks, block_size, kv_heads, head_dim)
    kv = [(torch.zeros(shape, dtype=dtype, device=device),
           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(layers)]
    pos = torch.arange(n, dtype=torch.int32, device=device)
    ctx = AttnContext(
        kv_caches=kv,
        slot_mapping=pos.long(),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device)[None],
        token_req=torch.zeros(n, dtype=torch.int32, device=device),
        token_pos=pos,
        backend=ref_attention,
    )
    ids = torch.tensor([token_ids], device=device)
    out = model(input_ids=ids, position_ids=pos[None], use_cache=False, gapless=ctx)
    return out.logits[0].float()
