"""Device sampling: greedy, temperature, top-k, top-p, seeds, all without a host sync."""

from __future__ import annotations

import torch

from engine.step.sampler import sample


def run(logits, temperature, top_k=None, top_p=None, seeds=None, pos=None, greedy_only=False):
    s = logits.shape[0]
    return sample(
        logits,
        torch.tensor(temperature, dtype=torch.float32),
        torch.tensor(top_k or [0] * s, dtype=torch.int32),
        torch.tensor(top_p or [1.0] * s, dtype=torch.float32),
        torch.tensor(seeds or list(range(s)), dtype=torch.int32),
        torch.tensor(pos or [5] * s, dtype=torch.int32),
        greedy_only,
    )


def test_temperature_zero_and_top_k_one_are_greedy():
    logits = torch.randn(6, 100)
    argmax = logits.argmax(-1)
    assert torch.equal(run(logits, [0.0] * 6), argmax)
    assert torch.equal(run(logits, [1.0] * 6, top_k=[1] * 6), argmax)
    assert torch.equal(run(logits, [1.0] * 6, top_p=[1e-6] * 6), argmax)


def test_same_seed_and_position_give_the_same_token_whatever_the_batch():
    logits = torch.randn(1, 200).repeat(4, 1)
    a = run(logits, [1.0] * 4, seeds=[11, 11, 12, 11], pos=[3, 3, 3, 4])
    assert a[0] == a[1]
    alone = run(logits[:1], [1.0], seeds=[11], pos=[3])
    assert alone[0] == a[0]
    draws = {int(run(logits[:1], [1.0], seeds=[s], pos=[3])[0]) for s in range(40)}
    assert len(draws) > 5  # different seeds do differ


def test_top_k_only_draws_from_the_k_best():
    logits = torch.randn(1, 50)
    best = set(logits[0].topk(3).indices.tolist())
    for seed in range(100):
        assert int(run(logits, [2.0], top_k=[3], seeds=[seed])[0]) in best


def test_top_p_keeps_the_smallest_set_over_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    got = {int(run(logits, [1.0], top_p=[0.7], seeds=[s])[0]) for s in range(200)}
    assert got == {0, 1}


def test_sampling_follows_the_softmax():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = torch.log(probs)[None].repeat(4000, 1)
    seeds = list(range(4000))
    toks = run(logits, [1.0] * 4000, seeds=seeds)
    freq = torch.bincount(toks, minlength=3).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq
