"""Model shapes for benchmarks: random weights built from a config (same cost as real ones).

Owns the presets and building a model from one; weights are random (bf16 by default) made on
the device, so no download is needed. The bytes a step reads are bench.harness.floor's.
"""

from __future__ import annotations

import torch

PRESETS: dict[str, dict] = {
    # Llama-3.1-8B's shape.
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    # Llama-3.2-1B's shape (tied embeddings, Llama-3.1 rope scaling).
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5,
                     tie_word_embeddings=True,
                     rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0,
                                          low_freq_factor=1.0, high_freq_factor=4.0,
                                          original_max_position_embeddings=8192)),
    # SmolLM2-135M's shape: 30 thin layers, launch-bound.
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    # Qwen3-0.6B's shape (q/k RMSNorm, head_dim 128 > hidden / heads).
    "qwen3-0.6b": dict(family="qwen3", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
    # Small enough for a CPU smoke run of the benchmark scripts.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}


def build_model(preset: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    params = {"tie_word_embeddings": False, **PRESETS[preset]}
    family = params.pop("family", "llama")
    cfg = (Qwen3Config if family == "qwen3" else LlamaConfig)(**params)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()

