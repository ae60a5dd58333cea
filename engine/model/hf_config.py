"""What the engine reads off a transformers config: the text model's config and KV shape.

Owns the few facts about a Hugging Face config that several parts need (the runner sizes
the KV cache with them, scoring builds a one-request cache, the engine reads the vocabulary
size). Pure attribute reading: never imports torch or transformers.
"""

from __future__ import annotations

from typing import Any


def text_config(hf_config: Any) -> Any:
    """The language model's config (multimodal configs nest it as text_config)."""
    return getattr(hf_config, "text_config", None) or hf_config


def kv_cache_shape(hf_config: object, tp_size: int = 1) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers config; with tensor
    parallelism, num_kv_heads is one rank's share (the cache is sharded by KV head)."""
    text = text_config(hf_config)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return text.num_hidden_layers, kv_heads // tp_size, head_dim
