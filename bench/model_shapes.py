"""Model shapes for benchmarks: random weights built from a config (same cost as real ones).

Owns the presets only; weights are random bf16 made on the device, so no download is needed.
"""

from __future__ import annotations

import torch

PRESETS: dict[str, dict] = {
    # Llama-3.1-8B's shape.
    "llama-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5),
    # Small enough for a CPU smoke run of the benchmark scripts.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}


def build_model(preset: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**PRESETS[preset], tie_word_embeddings=False)
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads: every parameter except the input embedding table (only
    the looked-up rows are read)."""
    emb = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)
