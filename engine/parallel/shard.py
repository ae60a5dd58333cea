"""Megatron-style shards of our fused Llama-family model, one rank's share at a time.

Owns cutting the tensors `engine.model.weights.build_fused_model` made into one rank's part:

    qkv      column-parallel: [q heads of the rank; k heads of the rank; v heads of the rank]
             (bias likewise); q/k norm weights are per head-dim, kept whole
    o        row-parallel (its input columns), followed by one all-reduce; bias on rank 0 only
    gate_up  column-parallel: [gate rows of the rank; up rows of the rank] (bias likewise)
    down     row-parallel, followed by one all-reduce; bias on rank 0 only
    embed    vocabulary-parallel rows (ids outside the rank's rows give zeros, all-reduced)
    lm_head  vocabulary-parallel rows, logits all-gathered; a vocabulary that does not divide
             by the ranks is padded with zero rows (their logits are cut off after the gather)
    norms, rotary table: whole on every rank

A bias added on one rank before the all-reduce is added once to the sum. Each shard is a copy
(`clone`), so the full tensors can be freed; the caller moves the shard to its device.
Never touches a process group (the model's collectives are `engine.parallel.comm.TPComm`).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.llama import FusedLlamaForCausalLM
from engine.parallel.comm import TPComm


def _part(t: torch.Tensor, rank: int, world: int, dim: int = 0) -> torch.Tensor:
    assert t.shape[dim] % world == 0, f"{t.shape[dim]} rows do not divide by {world} ranks"
    return t.chunk(world, dim=dim)[rank]


def shard_qkv(t: torch.Tensor, heads: int, kv_heads: int, head_dim: int, rank: int,
              world: int) -> torch.Tensor:
    """A fused qkv weight [(H + 2 KVH) D, hidden] (or bias [(H + 2 KVH) D]) -> the rank's
    [q_r; k_r; v_r] with H/world q heads and KVH/world k and v heads."""
    q, k, v = t.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=0)
    return torch.cat([_part(q, rank, world), _part(k, rank, world), _part(v, rank, world)])


def shard_gate_up(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """A fused gate_up weight [2 I, hidden] (or bias) -> the rank's [gate_r; up_r]."""
    gate, up = t.chunk(2, dim=0)
    return torch.cat([_part(gate, rank, world), _part(up, rank, world)])


def shard_row_parallel(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """o or down [out, in] -> the rank's input columns [out, in / world]."""
    return _part(t, rank, world, dim=1)


def shard_vocab(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """[V, hidden] -> the rank's rows of the vocabulary padded to a multiple of world."""
    per = -(-t.shape[0] // world)
    rows = t[rank * per : (rank + 1) * per]
    if rows.shape[0] < per:
        pad = rows.new_zeros((per - rows.shape[0], *rows.shape[1:]))
        rows = torch.cat([rows, pad])
    return rows


def _own(t: torch.Tensor | None) -> nn.Parameter | None:
    return None if t is None else nn.Parameter(t.contiguous().clone(), requires_grad=False)


@torch.no_grad()
def shard_fused_model(model: FusedLlamaForCausalLM, comm: TPComm) -> FusedLlamaForCausalLM:
    """Turn `model` (whole, as built from the checkpoint) into rank comm.rank's shard, in
    place; it then calls `comm` for its collectives."""
    rank, world = comm.rank, comm.world
    cfg = model.config
    heads = model.num_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    assert heads % world == 0 and kv_heads % world == 0, "checked at start (engine.parallel)"
    for layer in model.layers:
        head_dim = layer.qkv.shape[0] // (heads + 2 * kv_heads)
        layer.qkv = _own(shard_qkv(layer.qkv, heads, kv_heads, head_dim, rank, world))
        if layer.qkv_bias is not None:
            layer.qkv_bias = _own(shard_qkv(layer.qkv_bias, heads, kv_heads, head_dim, rank,
                                            world))
        layer.o = _own(shard_row_parallel(layer.o, rank, world))
        layer.o_bias = _own(layer.o_bias) if rank == 0 else None
        layer.gate_up = _own(shard_gate_up(layer.gate_up, rank, world))
        if layer.gate_up_bias is not None:
            layer.gate_up_bias = _own(shard_gate_up(layer.gate_up_bias, rank, world))
        layer.down = _own(shard_row_parallel(layer.down, rank, world))
        layer.down_bias = _own(layer.down_bias) if rank == 0 else None
        layer.tp = comm
    tied = model.lm_head.weight is model.embed_tokens.weight
    embed = _own(shard_vocab(model.embed_tokens.weight, rank, world))
    model.embed_tokens.weight = embed
    model.lm_head.weight = embed if tied else _own(shard_vocab(model.lm_head.weight, rank,
                                                              world))
    model.num_heads = heads // world
    model.tp = comm
    return model


def build_rank_model(model: nn.Module, comm: TPComm, max_model_len: int,
                     device: torch.device) -> FusedLlamaForCausalLM:
    """One rank's fused shard on `device`, from the whole transformers model loaded on the
    CPU (whose fused originals are released on the way: the loader owns it)."""
    from engine.model.weights import build_fused_model

    fused = build_fused_model(model, max_model_len, consume=True)
    return shard_fused_model(fused, comm).to(device)
