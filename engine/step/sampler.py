"""Sampling on the device: greedy, temperature, top-k and top-p as per-request tensors.

Owns turning logits into token ids without a host sync. Random draws come from a counter
hash of (request seed, position, vocab id), so a seeded request samples the same tokens
whatever it is batched with, in sync or async mode, eager or in a CUDA graph.
"""

from __future__ import annotations

import torch

_M1 = -4658895280553007687  # 0xBF58476D1CE4E5B9 as a signed int64
_M2 = -7723592293110705685  # 0x94D049BB133111EB
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_LOW53 = (1 << 53) - 1


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 (wrapping multiply; masks emulate logical shifts)."""
    x = x ^ ((x >> 30) & ((1 << 34) - 1))
    x = x * _M1
    x = x ^ ((x >> 27) & ((1 << 37) - 1))
    x = x * _M2
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def uniform_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, V] uniforms in (0, 1), a pure function of (seed, position, vocab id)."""
    base = _mix64(seeds.long() * _GOLDEN + positions.long())  # [S]
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = _mix64(base[:, None] + ids[None, :] * _GOLDEN)
    u = ((x >> 11) & _LOW53).double() * (1.0 / (1 << 53))
    return u.clamp_(1e-12, 1.0 - 1e-12).float()


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    greedy_only: bool,
) -> torch.Tensor:
    """logits [S, V]; per-row temperature (0 = greedy), top_k (<= 0 = off), top_p, seed, and
    the position of the token being sampled. Returns int64 token ids [S]."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if greedy_only:
        return greedy
    vocab = logits.shape[-1]
    scaled = logits / temperature.clamp(min=1e-6)[:, None]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k.long(), vocab)[:, None]
    drop = ranks >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    # Keep a token while the mass before it is under top_p (the first one always stays).
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    noise = uniform_noise(seeds, positions, vocab).gather(1, order)
    gumbel = -torch.log(-torch.log(noise))
    choice = (sorted_logits + gumbel).argmax(dim=-1, keepdim=True)
    sampled = order.gather(1, choice).squeeze(1)
    return torch.where(temperature > 0, sampled, greedy)
