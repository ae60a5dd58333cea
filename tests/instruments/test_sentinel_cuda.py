"""On a CUDA GPU, in bf16: the sentinel finds no mismatch over many requests in every pipeline
mode (CUDA graphs on and off, live switches between them), and fires when one carried-over
token is corrupted in async mode with graphs off (an eager step whose compute we can wrap)."""

from __future__ import annotations

import pytest
from engine_checks import mixed_prompts

from engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.cuda

SETTINGS = dict(device="cuda", dtype="bfloat16", max_num_seqs=6, max_num_batched_tokens=32,
                block_size=16, num_blocks=64, max_model_len=128, sentinel_sample_every=1)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


def test_cuda_sentinel_silent_across_live_switches(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), **SETTINGS)
    n = 0
    with Engine(cfg, start=False) as eng:
        for i, (async_, slots, graphs) in enumerate([(True, 2, True), (True, 1, False),
                                                    (False, 2, True), (True, 3, True)]):
            eng.configure(async_batching=async_, num_slots=slots, cuda_graphs=graphs)
            n += len(eng.generate(mixed_prompts(12, seed=i), GREEDY))
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert stats["sentinel_checked"] == n
    assert stats["sentinel_mismatches"] == 0, stats


def test_cuda_sentinel_fires_on_one_corrupted_token(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), **{**SETTINGS, "cuda_graphs": False})
    with Engine(cfg, start=False) as eng:
        runner, compute, calls = eng.runner, eng.runner.compute, []

        def corrupt_once(v, num_tokens, num_samples, greedy_only):
            compute(v, num_tokens, num_samples, greedy_only)
            calls.append(num_samples)
            if len(calls) == 12:
                row, pos = v.sample_row[0].long(), v.sample_pos[0].long()
                table = runner.token_table
                table[row, pos] = (table[row, pos] + 1) % eng.vocab_size

        runner.compute = corrupt_once
        eng.generate(mixed_prompts(12, seed=5), GREEDY)
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert stats["sentinel_mismatches"] == 1, stats
