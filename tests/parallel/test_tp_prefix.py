"""Prefix caching under tensor parallelism (CPU, gloo, 2 processes): greedy tokens with
caching on at TP 2 equal those with caching off at TP 1, sync and async, with chunked prefill
and preemption forced, and the shared prefix actually hit. The leader owns the
scheduler and the block tables; every rank writes and reads the same cached blocks of its
share of the KV heads, so a hit must be a hit on every rank."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_checks import assert_all_blocks_free  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def shared_prefix_prompts(n: int = 8, prefix_len: int = 30) -> list[list[int]]:
    """One common prefix (not block-aligned), then 1 to ~16 tokens of each prompt's own."""
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(1, 300, (prefix_len,), generator=g).tolist()
    return [prefix + torch.randint(1, 300, (1 + 3 * i,), generator=g).tolist()
            for i in range(n - 2)] + [list(prefix), list(prefix)]


PROMPTS = shared_prefix_prompts()


def two_rounds(eng: Engine) -> list[list[int]]:
    """The prompts twice: the second round hits what the first left cached."""
    out = [o.token_ids for _ in range(2) for o in eng.generate(PROMPTS, GREEDY)]
    assert_all_blocks_free(eng)
    return out


def test_tp2_with_prefix_caching_equals_tp1_without(tiny_model_dir):
    model_dir = str(tiny_model_dir("llama"))
    with Engine(EngineConfig(model=model_dir, prefix_caching=False, **TIGHT)) as one:
        reference = two_rounds(one)
    with Engine(EngineConfig(model=model_dir, tensor_parallel_size=2, prefix_caching=True,
                             async_batching=False, **TIGHT)) as eng:
        for mode in ("sync", "async"):
            eng.configure(async_batching=mode == "async")
            before = eng.stats()
            tokens = two_rounds(eng)
            after = eng.stats()
            assert after["prefix_cache_hits"] > before["prefix_cache_hits"], mode
            assert after["preemptions"] > before["preemptions"], \
                f"{mode}: the workload was meant to force preemption"
            for i, (got, want) in enumerate(zip(tokens, reference, strict=True)):
                assert got == want, f"TP 2 {mode}, caching on: prompt {i % len(PROMPTS)} " \
                    f"(round {i // len(PROMPTS) + 1}) diverged"
