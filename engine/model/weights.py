"""Whether a loaded transformers model maps onto our fused Llama blocks, and the conversion.

Owns `unsupported_reason` (None when the model is a Llama-family decoder we can run: Llama,
Mistral, Qwen2, Qwen3; otherwise a sentence saying why not) and `build_fused_model`, which
takes the transformers model the loader already loaded (same checkpoint, same dtype and
device) and builds `FusedLlamaForCausalLM` from its tensors: q/k/v concatenated into one qkv
weight (and bias), gate/up into one gate_up weight; every other tensor is shared, not copied.
With `consume=True` (the loader owns the model) each layer's q/k/v and gate/up originals are
released as soon as their fused copy exists, so the peak is one layer's worth above the model.

The rotary cos/sin table is computed by the model's own rotary module (its rope type and
scaling, on its device), so our rotary equals transformers' bit for bit.

Never reads the checkpoint files itself and never changes a model it does not own.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.model.llama import FusedDecoderLayer, FusedLlamaForCausalLM

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# Rope types whose cos/sin depend on the position only (a table computed once is exact);
# "dynamic" and "longrope" change with the sequence length.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")
LAYER_TYPES = ("full_attention", "sliding_attention")


def unsupported_reason(model: nn.Module) -> str | None:
    """None if `model` maps onto the fused Llama blocks, else why it does not."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type not in MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(MODEL_TYPES)}"
    if getattr(model, "hf_quantizer", None) is not None:
        return "quantized checkpoints are not supported by the fused path"
    if getattr(cfg, "hidden_act", "silu") not in ("silu", "swish"):
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else None
    if rope_type not in ROPE_TYPES:
        return f"rope type {rope_type!r} is not one of {', '.join(ROPE_TYPES)}"
    if float(rope.get("partial_rotary_factor", 1.0) if isinstance(rope, dict) else 1.0) != 1.0:
        return "partial rotary embeddings are not supported by the fused path"
    for lt in getattr(cfg, "layer_types", None) or []:
        if lt not in LAYER_TYPES:
            return f"layer type {lt!r} is not one of {', '.join(LAYER_TYPES)}"
    try:
        inner = model.model
        layer = inner.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight  # noqa: B018
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, name).weight  # noqa: B018
        layer.input_layernorm.weight, layer.post_attention_layernorm.weight  # noqa: B018
        inner.norm.weight, inner.embed_tokens.weight, inner.rotary_emb  # noqa: B018
        model.lm_head.weight  # noqa: B018
    except (AttributeError, IndexError, TypeError) as e:
        return f"the model's modules are not laid out as a Llama decoder ({e})"
    if not model.lm_head.weight.is_floating_point():
        return f"weights of dtype {model.lm_head.weight.dtype} are not supported"
    return None


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    if all(t is None for t in tensors):
        return None
    assert all(t is not None for t in tensors), "either all projections have a bias or none"
    return torch.cat(tensors, dim=0)  # type: ignore[arg-type]


def _release(*modules: nn.Module) -> None:
    for m in modules:
        for name, p in list(m.named_parameters(recurse=False)):
            setattr(m, name, nn.Parameter(p.new_empty(0), requires_grad=False))


def _bias(m: nn.Module) -> torch.Tensor | None:
    b = getattr(m, "bias", None)
    return None if b is None else b.data


@torch.no_grad()
def rotary_table(model: nn.Module, max_positions: int, dtype: torch.dtype) -> torch.Tensor:
    """[max_positions, 2, D/2] (cos, sin) in `dtype`, from the model's own rotary module."""
    rot = model.model.rotary_emb
    device = model.lm_head.weight.device
    pos = torch.arange(max_positions, device=device)[None]
    cos, sin = rot(torch.zeros(1, dtype=torch.float32, device=device), pos)
    half = cos.shape[-1] // 2
    head_dim = model.model.layers[0].self_attn.head_dim
    if 2 * half != head_dim:
        raise ValueError(f"rotary width {2 * half} != head_dim {head_dim}: partial rotary is "
                         "not supported by the fused path")
    # transformers rotates with cat(freqs, freqs): both halves of cos/sin are the same.
    return torch.stack((cos[0, :, :half], sin[0, :, :half]), dim=1).to(dtype).contiguous()


@torch.no_grad()
def build_fused_model(model: nn.Module, max_positions: int | None = None,
                      consume: bool = False) -> FusedLlamaForCausalLM:
    """Our fused model from a loaded transformers Llama-family model (see the module doc)."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"the fused Llama path cannot run this model: {reason}")
    cfg = model.config
    inner = model.model
    dtype = model.lm_head.weight.dtype
    heads = cfg.num_attention_heads
    eps = float(inner.norm.variance_epsilon)
    layers = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        qk_norm = None
        if q_norm is not None:
            qk_norm = torch.stack((q_norm.weight.data, k_norm.weight.data))
            assert float(q_norm.variance_epsilon) == eps
        window = getattr(attn, "sliding_window", getattr(cfg, "sliding_window", None))
        fused = FusedDecoderLayer(
            input_norm=layer.input_layernorm.weight.data,
            qkv=torch.cat([attn.q_proj.weight.data, attn.k_proj.weight.data,
                           attn.v_proj.weight.data]),
            qkv_bias=_cat([_bias(attn.q_proj), _bias(attn.k_proj), _bias(attn.v_proj)]),
            qk_norm=qk_norm,
            o=attn.o_proj.weight.data,
            o_bias=_bias(attn.o_proj),
            post_norm=layer.post_attention_layernorm.weight.data,
            gate_up=torch.cat([mlp.gate_proj.weight.data, mlp.up_proj.weight.data]),
            gate_up_bias=_cat([_bias(mlp.gate_proj), _bias(mlp.up_proj)]),
            down=mlp.down_proj.weight.data,
            down_bias=_bias(mlp.down_proj),
            sliding_window=int(window) if window else None,
            scaling=float(attn.scaling),
        )
        if consume:
            _release(attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj)
        layers.append(fused)
    n_pos = max(int(getattr(cfg, "max_position_embeddings", 0) or 0), max_positions or 0)
    if n_pos <= 0:
        raise ValueError("max_position_embeddings is missing; pass max_positions")
    embed = inner.embed_tokens.weight.data
    head = model.lm_head.weight
    tied = head is inner.embed_tokens.weight or head.data.data_ptr() == embed.data_ptr()
    return FusedLlamaForCausalLM(
        config=cfg,
        generation_config=getattr(model, "generation_config", None),
        embed=embed,
        layers=layers,
        norm=inner.norm.weight.data,
        lm_head=embed if tied else head.data,
        cos_sin=rotary_table(model, n_pos, dtype),
        num_heads=heads,
        eps=eps,
    ).eval()


def describe(model: Any) -> str:
    """'gapless' for our fused model, 'transformers' for anything else."""
    return getattr(model, "impl_name", "transformers")
