"""Inside the persistent decode layer (issue 22, `fused_layer: persistent`): where a layer's
time goes, and what its variants cost, on random bf16 weights at a preset's shapes.

Builds the decoder layers only (no embedding, LM head or sampling) with a paged cache at
`--context` for `--batch` decode tokens, and on the GPU:

1. times one decode step of all layers inside a CUDA graph (`--reps` steps a graph, three
   replays), for each variant: one launch a layer, + L2 prefetch of the next GEMM's weights,
   one launch for all layers (engine/model/persistent_model.py), + prefetch;
2. with the clock compiled in (`CLOCK`: every program writes %globaltimer at the start of
   the layer, before and after each barrier, and at its end), one eager step of the one-launch
   a layer and of the whole-model variant: per phase, the median over layers of the phase's
   span (first program in to last program out), of the barrier (last arrival to last
   departure), and the gap between layers (a kernel boundary, or the barrier between layers).

    python -m bench persistent-clock --preset smollm2-135m --batch 16     # ~20 s on an H200
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.harness import report

DESCRIPTION = "persistent decode layer: per-phase time, barriers, variants (CUDA)"
PRESETS = {  # layers, hidden, heads, kv heads, head_dim, intermediate
    "smollm2-135m": (30, 576, 9, 3, 64, 1536),
    "llama-1b": (16, 2048, 32, 8, 64, 8192),
}
PHASES = ("qkv+rope", "attention", "o", "gate_up", "down")
PREFETCH_MB = 16


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--preset", default="smollm2-135m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=16, help="decode tokens a step")
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache")
    ap.add_argument("--reps", type=int, default=10, help="steps in the timed graph")
    ap.add_argument("--per-sm", type=int, default=1, choices=(1, 2),
                    help="programs an SM (GAPLESS_PERSISTENT_PER_SM)")


def phase_table(ns: list[list[list[int]]]) -> dict[str, float]:
    """From stamps ns[layer][program][k] (k = 0 layer start, 2p+1 phase p done, 2p+2 after
    barrier p, 9 layer done; global timer, ns): medians over layers, in us, of each phase's
    span, each barrier's release (last arrival -> last departure) and the gap to the next
    layer (last program out -> first program of the next layer in)."""
    def col(layer, k):
        return [prog[k] for prog in layer]

    out: dict[str, list[float]] = {}
    for i, layer in enumerate(ns):
        for p, name in enumerate(PHASES):
            start = min(col(layer, 0)) if p == 0 else max(col(layer, 2 * p))
            out.setdefault(name, []).append(max(col(layer, 2 * p + 1)) - start)
            if p < 4:
                out.setdefault(f"barrier {p}", []).append(
                    max(col(layer, 2 * p + 2)) - max(col(layer, 2 * p + 1)))
        out.setdefault("layer", []).append(max(col(layer, 9)) - min(col(layer, 0)))
        if i + 1 < len(ns):
            out.setdefault("gap to next layer", []).append(min(col(ns[i + 1], 0))
                                                           - max(col(layer, 9)))
    return {k: round(statistics.median(v) / 1e3, 2) for k, v in out.items()}


def _case(preset: str, batch: int, context: int):
    from engine.attention.interface import AttnContext
    from engine.attention.triton_paged import paged_attention
    from engine.model.llama import FusedDecoderLayer

    n_layers, hidden, heads, kvh, d, inter = PRESETS[preset]
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).bfloat16()

    stack = [FusedDecoderLayer(
        input_norm=1 + rnd(hidden, scale=0.1), qkv=rnd((heads + 2 * kvh) * d, hidden,
                                                       scale=hidden ** -0.5),
        qkv_bias=None, qk_norm=None, o=rnd(hidden, heads * d, scale=(heads * d) ** -0.5),
        o_bias=None, post_norm=1 + rnd(hidden, scale=0.1),
        gate_up=rnd(2 * inter, hidden, scale=hidden ** -0.5), gate_up_bias=None,
        down=rnd(hidden, inter, scale=inter ** -0.5), down_bias=None, sliding_window=None,
        scaling=d ** -0.5) for _ in range(n_layers)]
    block, per_req = 16, -(-(context + 1) // 16)
    blocks = batch * per_req + 1
    kv = [(rnd(blocks, block, kvh, d), rnd(blocks, block, kvh, d)) for _ in range(n_layers)]
    bt = torch.arange(batch * per_req, dtype=torch.int32, device="cuda").view(batch, per_req)
    pos = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    ctx = AttnContext(kv_caches=kv, slot_mapping=bt[:, context // block].long() * block
                      + context % block, block_tables=bt,
                      token_req=torch.arange(batch, dtype=torch.int32, device="cuda"),
                      token_pos=pos, backend=paged_attention)
    model = SimpleNamespace(layers=stack, cos_sin=rnd(context + 8, 2, d // 2),
                            num_heads=heads, eps=1e-5)
    return model, ctx, rnd(batch, hidden)


def run(args: argparse.Namespace, out: Path) -> dict:
    if not torch.cuda.is_available():
        print("persistent-clock needs CUDA (no GPU here); nothing measured.")
        return {"measured": False}
    from bench.harness.timing import graph_seconds_per_call
    from engine.model.persistent_barrier import new_counter, timed_out
    from engine.model.persistent_layer import BARRIERS_PER_LAYER, persistent_layer
    from engine.model.persistent_model import LayerTable, persistent_model
    from engine.model.persistent_step import _tiles

    model, ctx, x = _case(args.preset, args.batch, args.context)
    first, k0 = model.layers[0], ctx.kv_caches[0][0]
    tiles = _tiles(args.batch, x.device, x.dtype, x.shape[1], first.gate_up.shape[0] // 2,
                   first.qkv.shape[0], model.num_heads, k0.shape[2], k0.shape[3], 2, args.per_sm)
    counter, table = new_counter(x.device), LayerTable()
    n = len(model.layers)

    def step(whole: bool, prefetch: int, clock: torch.Tensor | None = None,
             fence: bool | None = None) -> None:
        counter[:1].zero_()
        if whole:
            assert persistent_model(model, table, x, ctx.token_pos, ctx, tiles, counter,
                                    prefetch, clock)
            return
        for i, layer in enumerate(model.layers):
            persistent_layer(layer, x, ctx.token_pos, ctx, ctx.kv_caches[i], model.cos_sin,
                             model.num_heads, model.eps, tiles, counter,
                             i * BARRIERS_PER_LAYER, next_qkv=model.layers[(i + 1) % n].qkv,
                             prefetch_bytes=prefetch, clock=clock, fence=fence)

    rows, data = [], {"tiles": tiles._asdict(), "variants": {}, "phases": {}}
    for name, whole, prefetch, fence in (
            ("one launch a layer", False, 0, None),
            ("one launch a layer, barrier without the per-thread fences (wrong results on the "
             "H200 at c9c481b)", False, 0, 0),
            ("one launch a layer, fences after the wait only", False, 0, 2),
            (f"+ L2 prefetch {PREFETCH_MB} MB", False, PREFETCH_MB << 20, None),
            ("one launch for all layers", True, 0, None),
            (f"all layers + prefetch {PREFETCH_MB} MB", True, PREFETCH_MB << 20, None)):
        us = graph_seconds_per_call(lambda i, w=whole, p=prefetch, f=fence: step(w, p, None, f),
                                    1, args.reps) * 1e6
        data["variants"][name] = round(us, 1)
        rows.append([name, f"{us:.1f}", f"{us / n:.2f}"])
    phases = {}
    for name, whole in (("one launch a layer", False), ("one launch for all layers", True)):
        clock = torch.zeros(n, tiles.programs, 10, 2, dtype=torch.int64, device=x.device)
        for _ in range(2):  # the first compiles
            step(whole, 0, clock)
        torch.cuda.synchronize()
        phases[name] = phase_table(clock[..., 0].tolist())
    data["phases"] = phases
    data["barrier_timed_out"] = timed_out(counter)
    keys = list(next(iter(phases.values())))
    sections = [
        f"{args.preset}, batch {args.batch}, context {args.context}: {n} layers, grid "
        f"{tiles.programs} programs; tiles {tiles}",
        report.markdown_table(["variant", "layers, us a step", "us a layer"], rows),
        report.markdown_table(["median over layers (us, global timer)", *phases],
                              [[k, *(phases[v].get(k, "") for v in phases)] for k in keys]),
        f"barrier timed out: {data['barrier_timed_out']}",
    ]
    report.emit(out, "persistent_clock", "Inside the persistent decode layer", sections, data)
    return data
