"""On a CUDA GPU in bf16: the fused forward (model_impl 'gapless') gives transformers'
generate tokens, graphs off and on, sync and async; every captured bucket replays like eager;
the transformers path still does too. Tiny models with a large init scale have distinct
logits, so bf16 rounding differences (fused vs separate GEMMs) do not flip a greedy pick."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from helpers import assert_all_blocks_free, hf_greedy, mixed_prompts  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

pytestmark = pytest.mark.cuda

MAX_NEW = 12
TIGHT = dict(device="cuda", dtype="bfloat16", max_num_seqs=6, max_num_batched_tokens=16,
             block_size=16, num_blocks=9, max_model_len=96, attention_backend="triton")


def engine_outputs(model_dir, prompts, **kw):
    with Engine(EngineConfig(model=str(model_dir), **{**TIGHT, **kw})) as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                    ignore_eos=True))
        stats, settings = eng.stats(), eng.settings()
        assert_all_blocks_free(eng)
    return [o.token_ids for o in outs], stats, settings


@pytest.fixture(scope="module", params=["llama", "qwen3", "qwen2"])
def family(request, tiny_model_dir):
    model_dir = tiny_model_dir(request.param)
    prompts = mixed_prompts(9, seed=5)
    return model_dir, prompts, hf_greedy(model_dir, prompts, MAX_NEW, "cuda", torch.bfloat16)


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize(("async_batching", "num_slots"), [(False, 2), (True, 2), (True, 3)])
def test_fused_bf16_greedy_equals_generate(family, async_batching, num_slots, graphs):
    model_dir, prompts, expected = family
    got, stats, settings = engine_outputs(model_dir, prompts, async_batching=async_batching,
                                          num_slots=num_slots, cuda_graphs=graphs,
                                          model_impl="gapless")
    assert settings["model_impl"] == "gapless"
    assert settings["cuda_graphs"] is graphs, settings["cuda_graphs_reason"]
    assert stats["preemptions"] > 0
    assert got == expected


def test_transformers_impl_still_equals_generate(family):
    model_dir, prompts, expected = family
    got, _, settings = engine_outputs(model_dir, prompts, cuda_graphs=True,
                                      model_impl="transformers")
    assert settings["model_impl"] == "transformers"
    assert got == expected


def test_fused_torch_ops_on_cuda_match_triton_ops(family, monkeypatch):
    """The torch path of every fused op (what a CPU runs) on the GPU gives the same tokens:
    the Triton kernels and their torch twins round alike."""
    from engine.model import fused_ops

    model_dir, prompts, expected = family
    monkeypatch.setattr(fused_ops, "use_triton", lambda x: False)
    got, _, _ = engine_outputs(model_dir, prompts, cuda_graphs=True, model_impl="gapless")
    assert got == expected
