"""Our fused Llama-family forward (model_impl 'gapless') on CPU in fp32: greedy output equals
transformers' model.generate token for token, with chunked prefill and preemption forced,
for Llama, Mistral (with a sliding window shorter than the prompts), Qwen2 (qkv bias), Qwen3
(q/k norm), tied embeddings, and rope scaling (Llama-3.1, linear, YaRN); 'auto' picks it;
'gapless' refuses a model it cannot run, with a message naming the key."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts  # noqa: E402
from tiny_models import save_tiny_model  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

MAX_NEW = 12
TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)

VARIANTS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "mistral-window": ("mistral", {"sliding_window": 16}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama31-rope": ("llama", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama-linear-rope": ("llama", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "qwen2-yarn-rope": ("qwen2", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 32}}),
}


@pytest.fixture(scope="module")
def variant_dir(tmp_path_factory):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            family, overrides = VARIANTS[name]
            cache[name] = save_tiny_model(family, tmp_path_factory.mktemp(name), **overrides)
        return cache[name]

    return get


def run_engine(model_dir, prompts, **settings):
    cfg = EngineConfig(model=str(model_dir), **{**TIGHT, **settings})
    with Engine(cfg) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                    ignore_eos=True))
        stats, info = eng.stats(), eng.settings()
        assert_all_blocks_free(eng)
    return outs, stats, info


@pytest.mark.parametrize("name", list(VARIANTS))
def test_fused_greedy_matches_generate(variant_dir, name):
    model_dir = variant_dir(name)
    prompts = mixed_prompts(9)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    outs, stats, info = run_engine(model_dir, prompts, async_batching=False,
                                   model_impl="gapless")
    assert info["model_impl"] == "gapless"
    assert stats["preemptions"] > 0, "the workload was meant to force preemption"
    for p, o, e in zip(prompts, outs, expected, strict=True):
        assert o.token_ids == e, f"{name}: prompt of {len(p)} tokens diverged"


def test_fused_async_two_slots_matches_generate(variant_dir):
    model_dir = variant_dir("qwen3")
    prompts = mixed_prompts(9, seed=1)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    outs, stats, _ = run_engine(model_dir, prompts, async_batching=True, num_slots=2)
    assert stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == expected


def test_auto_picks_gapless_and_transformers_is_kept(variant_dir):
    model_dir = variant_dir("llama")
    for choice, expected in (("auto", "gapless"), ("transformers", "transformers")):
        cfg = EngineConfig(model=str(model_dir), model_impl=choice, **TIGHT)
        with Engine(cfg, start=False) as eng:
            assert eng.settings()["model_impl"] == expected


def test_gapless_refuses_an_unsupported_rope_type(tmp_path):
    model_dir = save_tiny_model("llama", tmp_path / "dyn", rope_parameters={
        "rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match="model_impl 'gapless'.*rope type 'dynamic'"):
        Engine(EngineConfig(model=str(model_dir), model_impl="gapless", **TIGHT), start=False)
    with Engine(EngineConfig(model=str(model_dir), model_impl="auto", **TIGHT),
                start=False) as eng:
        assert eng.settings()["model_impl"] == "transformers"


def test_model_impl_is_validated():
    with pytest.raises(ValueError, match="model_impl must be one of"):
        EngineConfig(model_impl="fast").validate()


@pytest.mark.parametrize("name", ["llama", "qwen3", "mistral-window"])
def test_transformers_impl_still_matches_generate(variant_dir, name):
    """'auto' serves these families with the fused path; the generic path (transformers'
    modeling code with our attention), which every other architecture takes, stays tested."""
    model_dir = variant_dir(name)
    prompts = mixed_prompts(9, seed=2)
    expected = hf_greedy(model_dir, prompts, MAX_NEW)
    outs, stats, info = run_engine(model_dir, prompts, async_batching=True,
                                   model_impl="transformers")
    assert info["model_impl"] == "transformers"
    assert stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == expected
