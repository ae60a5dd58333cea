"""Prefix caching on the GPU: bf16 greedy output identical with caching on and off (async,
CUDA graphs, chunked prefill and preemption forced by TIGHT_CUDA), and every block free after."""

from __future__ import annotations

import pytest
from engine_checks import cuda_engine_outputs
from test_prefix_cache import shared_prefix_prompts

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("async_batching", [False, True])
def test_bf16_greedy_is_the_same_with_caching_on_and_off(tiny_model_dir, family,
                                                         async_batching):
    model_dir = tiny_model_dir(family)
    prompts = shared_prefix_prompts(prefix_len=40)
    runs = {caching: cuda_engine_outputs(model_dir, prompts + prompts, 10,
                                         prefix_caching=caching, async_batching=async_batching)
            for caching in (False, True)}
    assert runs[True][0] == runs[False][0]
    assert runs[True][1]["prefix_cache_hits"] > 0 and runs[False][1]["prefix_cache_hits"] == 0
