"""A recorded step's byte floor (the honest floor) and its separate-kernel reference.

Owns the reads one step makes, their floor (all the bytes at the peak-copy bandwidth: the
limit) and their separate-kernel reference (each read a lone cold kernel at its size's
achievable bandwidth: no limit) from the curve the engine measured at start
(``Engine.floor_curve``, engine/instruments/floor_probe.py; telemetry/floor.py does the sums). A
step reads every weight tensor once (the input embedding table only where it is also the LM
head: otherwise a step reads a few of its rows) and, per layer, K and V over the batch's
contexts (one paged-attention read each; the contexts come from ``StepRecord.chunks``), as
bench/harness/truth_anatomy.py counts them. The step anatomy's summary reads it
(engine/instruments/anatomy.py). It never measures, and returns nothing without a curve.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from telemetry.floor import BandwidthCurve, separate_kernel_seconds


def weight_reads(model: torch.nn.Module) -> list[int]:
    """Bytes of each weight tensor one step reads."""
    emb = model.get_input_embeddings().weight
    head = getattr(model, "lm_head", None)
    tied = head is not None and getattr(head, "weight", None) is emb
    return [p.numel() * p.element_size() for p in model.parameters() if p is not emb or tied]


def step_floor(weights: Sequence[int], kv_bytes_per_token: int, layers: int,
               contexts: Iterable[int], curve: BandwidthCurve) -> dict[str, float | None]:
    """Bytes of one step, its floor and its reference (us): ``peak_floor_us`` at the curve's
    peak copy bandwidth (None without one), ``separate_kernel_reference_us`` each read a lone
    cold kernel at its size's bandwidth."""
    kv_layer = kv_bytes_per_token // (2 * layers)  # K (or V) of one layer, one token
    ctx = sum(contexts)
    reads = [*weights, *[kv_layer * ctx] * (2 * layers)] if ctx else list(weights)
    total = sum(reads)
    ref = separate_kernel_seconds(reads, curve)
    peak = curve.peak_copy_bw
    return {"floor_bytes": total, "peak_floor_us": total / peak * 1e6 if peak else None,
            "separate_kernel_reference_us": ref * 1e6 if ref is not None else None}


def engine_step_floors(engine: Any, records: Iterable[Any]) -> dict[int, dict[str, Any]]:
    """Each record's step floor on ``engine`` (its model, KV geometry and start-up curve),
    by step; empty without a curve (a CPU) or a model."""
    curve = getattr(engine, "floor_curve", None)
    model = getattr(engine, "model", None)
    kv = getattr(engine, "kv_bytes_per_token", None)
    if curve is None or model is None or not kv:
        return {}
    cfg = getattr(model.config, "text_config", None) or model.config
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    if layers <= 0:
        return {}
    try:
        weights = weight_reads(model)
    except (AttributeError, TypeError):  # a model without an input embedding to tell apart
        return {}
    return {r.step: step_floor(weights, int(kv), layers, (c for _, _, c in r.chunks), curve)
            for r in records if r.chunks}


def live_floor(model: torch.nn.Module, kv_bytes_per_token: float,
               curve: BandwidthCurve | None) -> Callable[[int], int] | None:
    """The byte floor (ns) of a step from its requests' total context, for the step records
    the loop publishes (``StepRecord.floor_ns``, the waterfall's floor part): every weight of
    ``model`` once plus ``kv_bytes_per_token`` per token of context, at the curve's peak copy
    bandwidth. Under tensor parallelism pass the leader's shard and one rank's KV share:
    every rank reads its own share at the same time. The peak-copy floor, not the
    separate-kernel reference: that assumes one cold read after another, which kernels that
    overlap beat (a small model's step with PDL prefetch runs below it), so it is no lower
    bound and could swallow all kernel time. None without a measured copy bandwidth (a
    CPU)."""
    bw = curve.peak_copy_bw if curve is not None else None
    if not bw:
        return None
    try:
        weights = sum(weight_reads(model))
    except (AttributeError, TypeError):
        return None

    def floor_ns(context_tokens: int) -> int:
        return int((weights + kv_bytes_per_token * context_tokens) / bw * 1e9)

    return floor_ns
