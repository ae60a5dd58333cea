"""The byte floor of a decode step: the bytes it must read (weights, then the KV cache of every
request) over a bandwidth. With no compute or launch cost it is what the step cannot beat.

COPY_BW is an H200's device-to-device copy bandwidth (docs/benchmarks.md gives the figure). The
separate-kernel reference reads each tensor as a lone cold kernel at the bandwidth a read of its
size achieves (telemetry.floor's measured curve): one read per weight tensor of the model, one
per layer for K and for V. It is what separate kernels cost, not a limit: kernels that overlap
run below it. It is imported lazily and the column is left out where the module or a curve is
absent. (The fused model reads qkv and gate_up as one tensor each, a larger and so slightly
faster read: for it the reference is a little high.) Pure arithmetic on shapes: never runs a
kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

COPY_BW = 4.22e12  # bytes/s: an H200's device-to-device copy (docs/benchmarks.md)


def read_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters one decode step reads: all but the input embedding table (only the
    looked-up rows are read), unless it is also the LM head (tied embeddings)."""
    emb = model.get_input_embeddings().weight
    head = getattr(model, "lm_head", None)
    tied = head is not None and head.weight is emb
    return [p for p in model.parameters() if p is not emb or tied]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads."""
    return sum(p.numel() * p.element_size() for p in read_parameters(model))


@dataclass(frozen=True, slots=True)
class ByteFloor:
    """Bytes a decode step reads for one model: weights once, KV per cached token."""

    weight_bytes: int
    kv_bytes_per_token: int  # K and V, every layer
    bandwidth: float = COPY_BW
    weight_reads: tuple[int, ...] = ()  # bytes of each weight tensor a step reads
    layers: int = 1

    @classmethod
    def of(cls, model: torch.nn.Module, bandwidth: float = COPY_BW) -> ByteFloor:
        from engine.model.hf_config import kv_cache_shape

        layers, kv_heads, head_dim = kv_cache_shape(model.config)
        itemsize = next(model.parameters()).element_size()
        reads = tuple(p.numel() * p.element_size() for p in read_parameters(model))
        return cls(weight_bytes(model), 2 * layers * kv_heads * head_dim * itemsize, bandwidth,
                   reads, layers)

    def reads(self, batch: int, context: int) -> list[int]:
        """Bytes of each read of one decode step: every weight tensor, then K and V of each
        layer (the whole batch's context)."""
        kv_each = self.kv_bytes(batch, context) // (2 * self.layers)
        return [*self.weight_reads, *[kv_each] * (2 * self.layers)]

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


def separate_kernel_seconds(reads: list[int], gpu: str | None) -> float | None:
    """The separate-kernel reference: seconds to do each read at the bandwidth a lone read of
    its size reaches on `gpu` (e.g. "NVIDIA H200"), by telemetry.floor's measured curve for that
    GPU model, summed; None off a GPU, or when that module or the GPU's curve is absent."""
    if gpu is None:
        return None
    try:
        from telemetry import floor as curves  # optional: the separate-kernel reference
    except ImportError:
        return None
    load = getattr(curves, "load_curve", None)
    total = getattr(curves, "separate_kernel_seconds", None)
    if not (callable(load) and callable(total)):
        return None
    curve = load(gpu)
    return None if curve is None else float(total(reads, curve))
