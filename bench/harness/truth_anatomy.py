"""The truth suite's step anatomy against its floor: one anatomy recording (async + graphs)
of a decoding batch; each kernel family's time against its bytes' peak-copy floor (the limit)
and its separate-kernel reference (each tensor a lone cold read at its size's achievable
bandwidth, telemetry/floor.py: what separate kernels cost, no limit);
the longest kernels. Also owns a decode step's reads (one per weight tensor and per layer's K
and V), which the truth suite's waterfall and GPM check use. `python -m bench anatomy` answers
where a step's time goes; the truth suite runs this on its first shape beside its busy
figures.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch

from bench.harness.floor import COPY_BW, ByteFloor


def step_reads(model: torch.nn.Module, floor: ByteFloor, contexts: list[int]) -> list[int]:
    """One decode step's reads, one per weight tensor and per layer's K and V."""
    emb = model.get_input_embeddings().weight
    head = getattr(model, "lm_head", None)
    tied = head is not None and head.weight is emb
    reads = [p.numel() * p.element_size() for p in model.parameters() if p is not emb or tied]
    layers = model.config.num_hidden_layers
    kv_layer = floor.kv_bytes_per_token // (2 * layers)  # K (or V) of one layer, one token
    reads += [kv_layer * sum(contexts)] * (2 * layers)
    return reads


def contexts_of(rec: Any, prompt: int, first_decode_step: int) -> list[int]:
    chunks = getattr(rec, "chunks", None)
    if chunks:
        return [ctx for _, _, ctx in chunks]
    return [prompt + max(0, rec.step - first_decode_step)] * max(1, rec.num_requests)


def anatomy_rows(eng: Any, model: torch.nn.Module, prompts: list[list[int]],
                 args: argparse.Namespace, curve: Any, out: Path) -> dict[str, Any]:
    from bench.harness.truth_engine import params, wait_decoding
    from engine.instruments.anatomy import record_anatomy
    from telemetry.anatomy import family_table
    from telemetry.floor import separate_kernel_seconds

    eng.configure(async_batching=True, cuda_graphs=args.device == "cuda")
    gen0 = eng.stats()["generated_tokens"]  # the engine's count since it started
    handles = [eng.submit(p, params(48)) for p in prompts]
    wait_decoding(eng, len(prompts))
    gen = eng.stats()["generated_tokens"]
    rec = record_anatomy(eng, 8, timeout_s=120, trace_dir=str(out))
    for h in handles:
        h.result(timeout=300)
    Path(rec.trace_path).unlink(missing_ok=True)
    steps = [s for s in rec.steps if s.kernels]
    floor = ByteFloor.of(model)
    # this batch's context when the recording starts (the engine's count is its lifetime's,
    # so only this batch's share of it)
    ctx = args.prompt + (gen - gen0) // len(prompts)
    reads = step_reads(model, floor, [ctx] * len(prompts))
    layers = model.config.num_hidden_layers
    kv_reads, w_reads = reads[-2 * layers:], reads[:-2 * layers]
    peak = curve.peak_copy_bw if curve is not None and curve.peak_copy_bw else COPY_BW
    fam_bytes = {"gemm": w_reads, "attention": kv_reads}
    rows = []
    for r in family_table(steps):
        rd = fam_bytes.get(r.family)
        ref = separate_kernel_seconds(rd, curve) if rd and curve is not None else None
        pk = sum(rd) / peak if rd else None
        rows.append({"family": r.family, "kernels": r.count, "time_us": r.time_us,
                     "share": r.share, "peak_floor_us": pk * 1e6 if pk else None,
                     "separate_kernel_reference_us": ref * 1e6 if ref else None})
    span = statistics.median(s.span_us for s in steps) if steps else None
    kernels = sorted((k for s in steps for k in s.kernels), key=lambda k: -k.dur_us)
    ref_all = separate_kernel_seconds(reads, curve) if curve is not None else None
    return {"steps": len(steps), "context": ctx, "span_us": span, "step_bytes": sum(reads),
            "peak_floor_us": sum(reads) / peak * 1e6, "peak_bw": peak,
            "separate_kernel_reference_us": ref_all * 1e6 if ref_all else None,
            "families": rows,
            "longest": [{"name": k.name[:90], "family": k.family, "us": k.dur_us}
                        for k in kernels[:5]]}


def num(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def anatomy_markdown(a: dict[str, Any]) -> list[str]:
    lines = [f"## Step anatomy (async + graphs, {a['steps']} steps, context "
             f"{a['context']}): median span {num(a['span_us'])} us; floor "
             f"{a['step_bytes'] / 1e9:.3f} GB = {a['peak_floor_us']:.1f} us at peak copy "
             f"({a['peak_bw'] / 1e12:.2f} TB/s); separate-kernel reference "
             f"{num(a['separate_kernel_reference_us'])} us", "",
             "| family | kernels/step | us/step | share | peak floor us | x | separate-kernel "
             "reference us | x |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in a["families"]:
        pk, ref = r["peak_floor_us"], r["separate_kernel_reference_us"]
        lines.append(f"| {r['family']} | {r['kernels']:.0f} | {r['time_us']:.1f} | "
                     f"{100 * r['share']:.1f}% | {num(pk)} | "
                     f"{num(r['time_us'] / pk if pk else None, '.2f')} | {num(ref)} | "
                     f"{num(r['time_us'] / ref if ref else None, '.2f')} |")
    return lines + ["", "longest kernels: " + "; ".join(
        f"{k['family']} {k['us']:.1f} us ({k['name'][:60]})" for k in a["longest"])]
