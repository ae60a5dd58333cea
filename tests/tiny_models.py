"""Tiny randomly initialised causal LMs written with save_pretrained, for engine tests.

Each family gets a config small enough for a 2-core CPU; weights use a large init scale so
greedy argmax has clear winners (near-ties would make equality tests flaky in low precision).
A byte-level BPE tokenizer trained on a few lines is saved beside the model, so the real
loading path (AutoModelForCausalLM / AutoTokenizer from a folder) is what the tests use.
"""

from __future__ import annotations

from pathlib import Path

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

_TEXT = [
    "def add(a, b):\n    return a + b\n",
    "the quick brown fox jumps over the lazy dog",
    "import os\nimport sys\nprint(os.getcwd())\n",
    "class Stack:\n    def push(self, x):\n        self.items.append(x)\n",
] * 20


def make_tokenizer(vocab_size: int = 256):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TEXT, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )


def make_config(family: str, vocab_size: int = 320, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        initializer_range=0.2, eos_token_id=0, bos_token_id=0, pad_token_id=0,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(head_dim=16, **common)
    if family == "mistral":
        return MistralConfig(**{"sliding_window": None, **common})
    raise ValueError(family)


def save_tiny_model(family: str, path: Path, seed: int = 0, **overrides) -> Path:
    from transformers import AutoModelForCausalLM

    tok = make_tokenizer()
    cfg = make_config(family, vocab_size=max(len(tok), 320), **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = 0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
