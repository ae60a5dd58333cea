"""The byte floor of a decode step: the bytes it must read (weights, then the KV cache of every
request) over a bandwidth. With no compute or launch cost it is what the step cannot beat.

COPY_BW is the device-to-device copy bandwidth measured on the lent H200 (4.22 TB/s). When
telemetry.floor exists (a measured bandwidth-vs-size curve), `size_aware_seconds` reads it too;
it is imported lazily and the column is left out where it is absent. Pure arithmetic on shapes:
never runs a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

COPY_BW = 4.22e12  # bytes/s, device-to-device copy on the lent H200 (docs/benchmarks.md)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes one decode step reads: every parameter except the input embedding table (only
    the looked-up rows are read), unless it is also the LM head (tied embeddings)."""
    emb = model.get_input_embeddings().weight
    head = getattr(model, "lm_head", None)
    tied = head is not None and head.weight is emb
    return sum(p.numel() * p.element_size() for p in model.parameters()
               if p is not emb or tied)


@dataclass(frozen=True, slots=True)
class ByteFloor:
    """Bytes a decode step reads for one model: weights once, KV per cached token."""

    weight_bytes: int
    kv_bytes_per_token: int  # K and V, every layer
    bandwidth: float = COPY_BW

    @classmethod
    def of(cls, model: torch.nn.Module, bandwidth: float = COPY_BW) -> ByteFloor:
        from engine.model.hf_config import kv_cache_shape

        layers, kv_heads, head_dim = kv_cache_shape(model.config)
        itemsize = next(model.parameters()).element_size()
        return cls(weight_bytes(model), 2 * layers * kv_heads * head_dim * itemsize, bandwidth)

    def kv_bytes(self, batch: int, context: int) -> int:
        return batch * context * self.kv_bytes_per_token

    def step_bytes(self, batch: int, context: int) -> int:
        return self.weight_bytes + self.kv_bytes(batch, context)

    def step_seconds(self, batch: int, context: int) -> float:
        """One decode step of `batch` requests each holding `context` tokens."""
        return self.step_bytes(batch, context) / self.bandwidth

    def decode_seconds(self, batch: int, prompt: int, new: int) -> float:
        """`new` decode steps after a `prompt`-token prefill, the context growing by one."""
        return sum(self.step_seconds(batch, prompt + i) for i in range(new))


def size_aware_seconds(nbytes: int) -> float | None:
    """Seconds to read `nbytes` by telemetry.floor's measured bandwidth-vs-size curve, or None
    when that module (or a usable function in it) is absent."""
    try:
        from telemetry import floor as curve  # optional: the size-aware floor
    except ImportError:
        return None
    for name in ("floor_seconds", "read_seconds", "seconds_for_bytes"):
        fn = getattr(curve, name, None)
        if callable(fn):
            return float(fn(nbytes))
    fn = getattr(curve, "bandwidth_at", None)
    if callable(fn):
        return nbytes / float(fn(nbytes))
    return None
