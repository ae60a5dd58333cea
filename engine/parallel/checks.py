"""Start-up checks of tensor_parallel_size against the machine and the model.

Owns the clear errors for bad settings, raised before anything big is allocated: more ranks
than GPUs, heads (or the MLP width) that do not divide by the ranks, a model our fused path
cannot run. Pure checks: never starts a process or touches a device.
"""

from __future__ import annotations

from typing import Any


def check_device_count(tp: int, device_type: str, gpus: int) -> None:
    """On CUDA, one GPU per rank."""
    if device_type == "cuda" and tp > gpus:
        raise ValueError(
            f"tensor_parallel_size={tp} needs {tp} GPUs (one per rank), but {gpus} "
            f"{'is' if gpus == 1 else 'are'} present; give tensor_parallel_size <= {gpus}"
        )


def allowed_sizes(text_cfg: Any) -> list[int]:
    """Every tensor_parallel_size that divides the model's heads, KV heads and MLP width."""
    dims = _dims(text_cfg)
    return [n for n in range(1, min(dims.values()) + 1) if all(d % n == 0 for d in dims.values())]


def check_model_shape(tp: int, text_cfg: Any) -> None:
    """Each rank holds an equal share of the q heads, the KV heads and the MLP columns."""
    dims = _dims(text_cfg)
    bad = {k: v for k, v in dims.items() if v % tp}
    if bad:
        what = " and ".join(f"{k}={v}" for k, v in bad.items())
        raise ValueError(
            f"tensor_parallel_size={tp} does not divide {what} (each rank holds an equal "
            f"share); allowed for this model: {', '.join(map(str, allowed_sizes(text_cfg)))}"
        )


def check_fused(tp: int, reason: str | None, model_impl: str) -> None:
    """TP > 1 runs only our fused Llama-family path."""
    if reason is not None:
        raise ValueError(
            f"tensor_parallel_size={tp} needs our fused Llama-family path (model_impl "
            f"{model_impl!r}), which cannot run this model: {reason}; use "
            "tensor_parallel_size 1"
        )


def _dims(text_cfg: Any) -> dict[str, int]:
    heads = int(text_cfg.num_attention_heads)
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(text_cfg, "num_key_value_heads", None) or heads),
        "intermediate_size": int(text_cfg.intermediate_size),
    }
