"""Greedy output equals transformers' model.generate token for token, with chunked prefill
and preemption forced, for several model families and every pipeline mode."""

from __future__ import annotations

import pytest
from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts

from engine import Engine, EngineConfig, SamplingParams

MAX_NEW = 12

# A budget of 16 tokens forces chunked prefill (prompts up to 70 tokens); 24 blocks of 4
# tokens (96 usable slots) cannot hold 9 requests of up to 82 tokens at once: preemption.
TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)


def run_engine(model_dir, prompts, **settings):
    cfg = EngineConfig(model=str(model_dir), **{**TIGHT, **settings})
    with Engine(cfg) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                    ignore_eos=True))
        stats = eng.stats()
        assert_all_blocks_free(eng)
    return outs, stats


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen2", "mistral"])
def test_greedy_matches_generate_with_chunking_and_preemption(tiny_model_dir, family):
    model_dir = tiny_model_dir(family)
    prompts = mixed_prompts(9)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    outs, stats = run_engine(model_dir, prompts, async_batching=False)
    assert stats["preemptions"] > 0, "the workload was meant to force preemption"
    for p, o, e in zip(prompts, outs, expected, strict=True):
        assert o.finish_reason == "length"
        assert o.token_ids == e, f"prompt of {len(p)} tokens diverged"


@pytest.mark.parametrize("num_slots", [1, 2, 3])
def test_async_modes_match_generate(tiny_model_dir, num_slots):
    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(9, seed=1)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    outs, stats = run_engine(model_dir, prompts, async_batching=True, num_slots=num_slots)
    assert stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == expected
