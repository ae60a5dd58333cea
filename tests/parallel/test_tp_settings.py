"""Bad tensor-parallel settings are clear errors at start, before any worker process exists:
more ranks than GPUs, heads that do not divide by the ranks, model_impl 'transformers', a model
our fused path cannot run, an in-memory model."""

from __future__ import annotations

import multiprocessing

import pytest
from tiny_models import make_tokenizer

from engine import Engine, EngineConfig
from engine.parallel import checks

TIGHT = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)


@pytest.fixture(autouse=True)
def no_children_left():
    before = set(multiprocessing.active_children())
    yield
    assert set(multiprocessing.active_children()) == before, "a refused start left a worker"


def test_more_ranks_than_gpus_names_both_numbers():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 needs 4 GPUs .* but 2 are "
                       r"present; give tensor_parallel_size <= 2"):
        checks.check_device_count(4, "cuda", 2)
    checks.check_device_count(2, "cuda", 2)
    checks.check_device_count(8, "cpu", 0)  # the CPU runs any number of gloo processes


def test_heads_not_divisible_say_which_sizes_are_allowed(tiny_model_dir):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=3 does not divide "
                       r"num_attention_heads=4 and num_key_value_heads=2 and "
                       r"intermediate_size=128.*allowed for this model: 1, 2"):
        Engine(EngineConfig(model=str(tiny_model_dir("llama")), tensor_parallel_size=3,
                            **TIGHT), start=False)


def test_transformers_impl_is_refused_by_the_config():
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs our fused Llama-family "
                       "path, but model_impl is 'transformers'"):
        EngineConfig(tensor_parallel_size=2, model_impl="transformers").validate()
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="tensor_parallel_size must be an integer >= 1"):
            EngineConfig(tensor_parallel_size=bad).validate()


def test_a_model_the_fused_path_cannot_run_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = make_tokenizer()
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2,
                               n_positions=128)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 needs our fused Llama-family "
                       r"path \(model_impl 'auto'\), which cannot run this model: model_type "
                       r"'gpt2'"):
        Engine(EngineConfig(model=str(tmp_path), tensor_parallel_size=2, **TIGHT), start=False)


def test_an_in_memory_model_is_refused(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"))
    with pytest.raises(ValueError, match="an in-memory model cannot be sharded"):
        Engine(EngineConfig(model="unused", tensor_parallel_size=2, **TIGHT), model=model,
               start=False)
