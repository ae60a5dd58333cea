"""The Megatron shards, one process: what the ranks compute from their shards, combined the way
their collectives combine it (sum for row-parallel outputs, concatenation for the vocabulary),
equals the unsharded layer, for the fused qkv (with bias), gate-up + down, o, the embedding and
the LM head, with a vocabulary that does not divide by the ranks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.fused_ops import silu_and_mul_torch
from engine.parallel.comm import TPComm
from engine.parallel.shard import (
    shard_gate_up,
    shard_qkv,
    shard_row_parallel,
    shard_vocab,
)


class RankPart(TPComm):
    """One rank's share before its all-reduce (the test sums the ranks' shares itself)."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 32, 4, 2, 8, 48


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("world", [1, 2])
def test_qkv_shard_holds_the_ranks_heads(world):
    rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    w, b, x = rand(rows, HIDDEN, seed=0), rand(rows, seed=1), rand(5, HIDDEN, seed=2)
    full = F.linear(x, w, b).view(5, HEADS + 2 * KV_HEADS, HEAD_DIM)
    q, k, v = full.split([HEADS, KV_HEADS, KV_HEADS], dim=1)
    hq, hk = HEADS // world, KV_HEADS // world
    for r in range(world):
        part = F.linear(x, shard_qkv(w, HEADS, KV_HEADS, HEAD_DIM, r, world),
                        shard_qkv(b, HEADS, KV_HEADS, HEAD_DIM, r, world))
        part = part.view(5, hq + 2 * hk, HEAD_DIM)
        expect = torch.cat([q[:, r * hq:(r + 1) * hq], k[:, r * hk:(r + 1) * hk],
                            v[:, r * hk:(r + 1) * hk]], dim=1)
        torch.testing.assert_close(part, expect)


@pytest.mark.parametrize("world", [2, 4])
def test_attention_output_then_mlp_sums_to_the_unsharded_block(world):
    """Per rank: its heads' attention output through its o columns (all-reduced), then its
    gate/up rows and down columns (all-reduced)."""
    o, attn = rand(HIDDEN, HEADS * HEAD_DIM, seed=3), rand(5, HEADS * HEAD_DIM, seed=4)
    heads_per = HEADS // world * HEAD_DIM
    parts = [F.linear(attn[:, r * heads_per:(r + 1) * heads_per], shard_row_parallel(o, r, world))
             for r in range(world)]
    torch.testing.assert_close(sum(parts), F.linear(attn, o))

    gate_up, down, h = rand(2 * INTER, HIDDEN, seed=5), rand(HIDDEN, INTER, seed=6), rand(
        5, HIDDEN, seed=7)
    full = F.linear(silu_and_mul_torch(F.linear(h, gate_up)), down)
    parts = [F.linear(silu_and_mul_torch(F.linear(h, shard_gate_up(gate_up, r, world))),
                      shard_row_parallel(down, r, world)) for r in range(world)]
    torch.testing.assert_close(sum(parts), full)


def test_a_shard_that_would_mix_gate_and_up_rows_is_caught():
    """The negative control: a plain row split of the fused gate_up (gate rows to rank 0, up
    rows to rank 1) is not a Megatron shard, and the sum then differs."""
    gate_up, down, h = rand(2 * INTER, HIDDEN, seed=5), rand(HIDDEN, INTER, seed=6), rand(
        5, HIDDEN, seed=7)
    full = F.linear(silu_and_mul_torch(F.linear(h, gate_up)), down)
    wrong = [F.linear(silu_and_mul_torch(F.linear(h, gate_up.chunk(2)[r])),
                      shard_row_parallel(down, r, 2)) for r in range(2)]
    assert not torch.allclose(sum(wrong), full)


@pytest.mark.parametrize("world", [2, 3])
def test_vocab_parallel_embedding_and_logits(world):
    vocab = 321  # divides by neither 2 nor 3: the last rank's rows are padded
    emb, h = rand(vocab, HIDDEN, seed=8), rand(4, HIDDEN, seed=9)
    ids = torch.tensor([0, 5, 160, 161, 320, 200])
    partial, logits = [], []
    for r in range(world):
        comm = RankPart(r, world, vocab, cuda=False)
        rows = shard_vocab(emb, r, world)
        assert rows.shape[0] == comm.vocab_per_rank
        partial.append(comm.embed(rows, ids))
        logits.append(F.linear(h, rows))
    torch.testing.assert_close(sum(partial), F.embedding(ids, emb))
    gathered = torch.cat(logits, dim=-1)
    assert gathered.shape[1] == world * -(-vocab // world) >= vocab
    torch.testing.assert_close(gathered[:, :vocab], F.linear(h, emb))
    assert torch.count_nonzero(gathered[:, vocab:]) == 0  # padding rows are zeros
