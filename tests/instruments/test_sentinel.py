"""The async-correctness sentinel: silent on a clean engine across live switches, loud when one
carried-over token is corrupted in async mode, sampling only finished greedy requests."""

from __future__ import annotations

import pytest
import torch
from engine_checks import mixed_prompts

from engine import Engine, EngineConfig, SamplingParams

# Chunked prefill (budget 16), several requests per step, async with two slots.
SETTINGS = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
                num_blocks=80, max_model_len=96, async_batching=True, num_slots=2)
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


def engine(model_dir, **overrides) -> Engine:
    cfg = EngineConfig(model=str(model_dir), **{**SETTINGS, **overrides})
    return Engine(cfg, start=False)


def test_off_by_default(tiny_model_dir):
    assert EngineConfig().sentinel_sample_every == 0
    with engine(tiny_model_dir("llama")) as eng:
        eng.generate(mixed_prompts(4), GREEDY)
        stats = eng.stats()
        assert eng.settings()["sentinel_sample_every"] == 0
    assert stats["sentinel_checked"] == 0 and stats["sentinel_queued"] == 0


def test_clean_engine_has_no_mismatch_across_live_switches(tiny_model_dir):
    with engine(tiny_model_dir("llama"), sentinel_sample_every=1) as eng:
        n = 0
        for i, (async_, slots) in enumerate([(True, 2), (True, 1), (False, 2), (True, 3)]):
            eng.configure(async_batching=async_, num_slots=slots)
            prompts = mixed_prompts(12, seed=i)
            outs = eng.generate(prompts, GREEDY)
            n += len(outs)
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert stats["sentinel_checked"] == n
    assert stats["sentinel_tokens_checked"] == n * GREEDY.max_tokens
    assert stats["sentinel_mismatches"] == 0, stats
    assert stats["sentinel_skipped"] == 0


def test_one_corrupted_carry_over_token_makes_it_fire(tiny_model_dir):
    """A race that feeds the next step a wrong token (the carried-over token in the device
    table differs from the one delivered): every delivered token looks plausible, but the
    ones after it were computed from a context the client never saw."""
    with engine(tiny_model_dir("llama"), sentinel_sample_every=1) as eng:
        runner, compute, calls = eng.runner, eng.runner.compute, []

        def corrupt_once(v, num_tokens, num_samples, greedy_only):
            compute(v, num_tokens, num_samples, greedy_only)
            calls.append(num_samples)
            if len(calls) == 12:  # mid-run, requests decoding
                row, pos = int(v.sample_row[0]), int(v.sample_pos[0])
                table = runner.token_table
                table[row, pos] = (table[row, pos] + 1) % eng.vocab_size

        runner.compute = corrupt_once
        eng.generate(mixed_prompts(12, seed=5), GREEDY)
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert len(calls) > 12
    assert stats["sentinel_mismatches"] == 1, stats
    assert 1 <= stats["sentinel_tokens_mismatched"] < GREEDY.max_tokens
    last = eng.instruments.sentinel.last_mismatch
    assert last is not None and last.produced != last.expected


def test_samples_one_in_n_greedy_requests_only(tiny_model_dir):
    with engine(tiny_model_dir("llama"), sentinel_sample_every=3) as eng:
        sampled = SamplingParams(max_tokens=4, temperature=0.8, seed=1, ignore_eos=True)
        eng.generate(mixed_prompts(9, seed=2), sampled)
        eng.generate(mixed_prompts(9, seed=3), GREEDY)
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert stats["sentinel_checked"] == 3  # the 3rd, 6th and 9th greedy request
    assert stats["sentinel_mismatches"] == 0


def test_live_toggle_and_validation(tiny_model_dir):
    with engine(tiny_model_dir("llama")) as eng:
        assert eng.configure(sentinel_sample_every=2)["sentinel_sample_every"] == 2
        eng.generate(mixed_prompts(4, seed=4), GREEDY)
        eng.instruments.sentinel.drain()
        assert eng.stats()["sentinel_checked"] == 2
        assert eng.configure(sentinel_sample_every=0)["sentinel_sample_every"] == 0
        eng.generate(mixed_prompts(4, seed=4), GREEDY)
        assert eng.stats()["sentinel_checked"] == 2
        for bad in (-1, True, 1.5, "4"):
            with pytest.raises(ValueError, match="sentinel_sample_every"):
                eng.configure(sentinel_sample_every=bad)
    with pytest.raises(ValueError, match="sentinel_sample_every"):
        EngineConfig(sentinel_sample_every=-2).validate()


def test_margin_forgives_ties_not_errors():
    from engine.instruments.sentinel import Sentinel, _Check

    s = Sentinel(model=None, backend=None, stream=None, event=None, device=torch.device("cpu"),
                 dtype=torch.bfloat16, chunk_tokens=16, block_size=4, sample_every=1)
    rel, abs_ = s.tie_margin
    check = _Check("r", [1, 2, 3, 4], prompt_len=1)
    gap = torch.tensor([0.0, 0.5 * abs_, 5.0])  # top logits 10: a tie is within 0.2 + abs
    check.gaps = [torch.stack([gap, gap - (rel * 10.0 + abs_)])]
    check.expected = [torch.tensor([2, 9, 9])]
    s._judge(check)
    assert (s.checked, s.mismatches, s.tokens_mismatched, s.ties) == (1, 1, 1, 1)
    assert s.last_mismatch is not None and s.last_mismatch.index == 2


def test_bf16_clean_engine_has_no_mismatch(tiny_model_dir):
    with engine(tiny_model_dir("llama"), dtype="bfloat16", sentinel_sample_every=1) as eng:
        outs = eng.generate(mixed_prompts(12, seed=6), GREEDY)
        eng.instruments.sentinel.drain()
        stats = eng.stats()
    assert stats["sentinel_checked"] == len(outs)
    assert stats["sentinel_mismatches"] == 0, stats
