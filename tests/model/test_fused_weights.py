"""Building the fused model from a transformers model: which models map onto it, fused
tensors equal the originals' concatenation, shared tensors are not copied, and a consumed
model's replaced originals are released."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny_models import make_config  # noqa: E402

from engine.model.weights import build_fused_model, unsupported_reason  # noqa: E402


def _hf(family: str, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(make_config(family, **overrides)).eval()


def test_only_llama_family_decoders_map_onto_the_fused_blocks():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert "model_type 'gpt2'" in unsupported_reason(gpt2)
    assert "hidden_act 'gelu'" in unsupported_reason(_hf("llama", hidden_act="gelu"))
    for family in ("llama", "qwen2", "qwen3", "mistral"):
        assert unsupported_reason(_hf(family)) is None


def test_fused_tensors_concatenate_and_share_the_originals():
    hf = _hf("qwen2")
    fused = build_fused_model(hf)
    attn, mlp = hf.model.layers[1].self_attn, hf.model.layers[1].mlp
    layer = fused.layers[1]
    assert torch.equal(layer.qkv, torch.cat([attn.q_proj.weight, attn.k_proj.weight,
                                             attn.v_proj.weight]))
    assert torch.equal(layer.qkv_bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias,
                                                  attn.v_proj.bias]))
    assert torch.equal(layer.gate_up, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert layer.o.data_ptr() == attn.o_proj.weight.data_ptr(), "o is shared, not copied"
    assert layer.down.data_ptr() == mlp.down_proj.weight.data_ptr()
    assert layer.o_bias is None and layer.qk_norm is None


def test_consume_releases_the_replaced_originals():
    hf = _hf("qwen3")
    fused = build_fused_model(hf, consume=True)
    for layer in hf.model.layers:
        for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.mlp.up_proj):
            assert m.weight.numel() == 0
    assert fused.layers[0].qk_norm.shape == (2, 16)
    assert sum(p.numel() for p in fused.parameters()) > 0
