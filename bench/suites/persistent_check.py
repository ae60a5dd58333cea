"""Is the one-launch persistent decode layer right on this GPU, and if not, where does it go
wrong? (issue 22: on the H200 at c9c481b the one-launch kernel differed from one launch a phase
by up to 0.30 after three layers, and greedy tokens went far beyond bf16 ties.)

One random layer at a shape, the same inputs each time, launched in several ways (engine/
model/persistent_layer.py `launch_layer`: which phases share a launch, how many programs):

- one launch a phase on the persistent grid (the reference of the others), and on 1 program;
- all five phases in one launch (grid barriers), on the grid and on 1 program (a barrier with
  one program waits for nobody: a difference there is the compiled code, not memory order),
  and on the grid with every thread fencing at each barrier (GAPLESS_PERSISTENT_FENCE);
- with --pairs, two consecutive phases p, p+1 in one launch, the others alone: which barrier
  crossing breaks.

For each: the largest |difference| from the reference of q, the new K and V rows, the attention
output, SiLU*up, the new hidden state; and the hidden state's relative error against an fp32
torch computation of the layer (which of the launches is right).

    python -m bench persistent-check --shapes tiny,smollm2-135m,llama-1b     # ~30 s on an H200
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench.harness import report

DESCRIPTION = "persistent decode layer: one launch vs one launch a phase, phase by phase (CUDA)"
SHAPES = {  # hidden, heads, kv heads, head_dim, intermediate, tokens, context
    "tiny": (64, 4, 2, 16, 128, 16, 40),
    "smollm2-135m": (576, 9, 3, 64, 1536, 16, 264),
    "llama-1b": (2048, 32, 8, 64, 8192, 1, 264),
}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shapes", default="tiny,smollm2-135m,llama-1b")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--pairs", action="store_true",
                    help="also two consecutive phases at a time in one launch (4 more compiles)")


def _layer(shape: str, dtype: torch.dtype):
    from engine.attention.interface import AttnContext
    from engine.attention.reference import paged_attention
    from engine.model.llama import FusedDecoderLayer

    hidden, heads, kvh, d, inter, t, context = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(hidden + t)

    def rnd(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(dtype)

    layer = FusedDecoderLayer(
        input_norm=1 + rnd(hidden, scale=0.1), qkv=rnd((heads + 2 * kvh) * d, hidden,
                                                       scale=hidden ** -0.5),
        qkv_bias=None, qk_norm=None, o=rnd(hidden, heads * d, scale=(heads * d) ** -0.5),
        o_bias=None, post_norm=1 + rnd(hidden, scale=0.1),
        gate_up=rnd(2 * inter, hidden, scale=hidden ** -0.5), gate_up_bias=None,
        down=rnd(hidden, inter, scale=inter ** -0.5), down_bias=None, sliding_window=None,
        scaling=d ** -0.5)
    per_req = -(-(context + 1) // 16)
    kv = (rnd(t * per_req + 1, 16, kvh, d), rnd(t * per_req + 1, 16, kvh, d))
    bt = torch.arange(t * per_req, dtype=torch.int32, device="cuda").view(t, per_req)
    pos = torch.full((t,), context, dtype=torch.int32, device="cuda")
    ctx = AttnContext(kv_caches=[kv], slot_mapping=bt[:, context // 16].long() * 16
                      + context % 16, block_tables=bt,
                      token_req=torch.arange(t, dtype=torch.int32, device="cuda"),
                      token_pos=pos, backend=paged_attention)
    return layer, ctx, rnd(context + 8, 2, d // 2), rnd(t, hidden), heads


def _reference(layer, ctx, cos_sin, x, heads) -> torch.Tensor:
    """The layer in fp32 torch ops (its own copy of the caches)."""
    from engine.attention.reference import paged_attention
    from engine.model.fused_gemm import fused_linear_torch
    from engine.model.fused_rope import fused_qkv_rope_torch

    f = lambda t: t.float()  # noqa: E731
    k, v = (c.float().clone() for c in ctx.kv_caches[0])
    q, _ = fused_qkv_rope_torch(f(x), None, f(layer.qkv), None, norm=f(layer.input_norm),
                                eps=1e-5, cos_sin=f(cos_sin), positions=ctx.token_pos,
                                slot_mapping=ctx.slot_mapping, k_cache=k, v_cache=v,
                                num_heads=heads)
    attn = paged_attention(q, k, v, ctx.block_tables, ctx.token_req, ctx.token_pos,
                           scale=layer.scaling)
    x1 = fused_linear_torch(attn.reshape(x.shape[0], -1), f(layer.o), residual=f(x))
    a = fused_linear_torch(x1, f(layer.gate_up), norm=f(layer.post_norm), eps=1e-5, pair=True)
    return fused_linear_torch(a, f(layer.down), residual=x1)


def check(shape: str, dtype: torch.dtype, pairs: bool = False) -> list[list[str]]:
    from engine.model.persistent_barrier import new_counter, timed_out
    from engine.model.persistent_layer import launch_layer, launch_parts
    from engine.model.persistent_step import _tiles

    layer, ctx, cos_sin, x0, heads = _layer(shape, dtype)
    k0, v0 = (c.clone() for c in ctx.kv_caches[0])
    t, hidden = x0.shape
    tiles = _tiles(t, x0.device, dtype, hidden, layer.gate_up.shape[0] // 2,
                   layer.qkv.shape[0], heads, k0.shape[2], k0.shape[3], x0.element_size())
    ref = _reference(layer, ctx, cos_sin, x0, heads)
    counter = new_counter(x0.device)
    slots = ctx.slot_mapping

    def run(launches, programs, fence=0):
        ctx.kv_caches[0][0].copy_(k0)
        ctx.kv_caches[0][1].copy_(v0)
        x = x0.clone()
        parts = launch_parts(layer, x, ctx, ctx.kv_caches[0], cos_sin, heads, tiles, None, 0)
        for b in parts.buffers:
            b.fill_(float("nan"))
        counter[:1].zero_()
        launch_layer(layer, x, ctx.token_pos, ctx, ctx.kv_caches[0], cos_sin, 1e-5, counter,
                     0, parts, launches=launches, programs=programs, fence=fence)
        torch.cuda.synchronize()
        k, v = ctx.kv_caches[0]
        q, attn, act = parts.buffers
        return dict(q=q.clone(), k=k.view(-1, *k.shape[2:])[slots].clone(),
                    v=v.view(-1, *v.shape[2:])[slots].clone(), attn=attn.clone(),
                    act=act.clone(), x=x)

    alone = [(p, p, False) for p in range(5)]
    grid = tiles.programs
    variants = {"one launch a phase": (alone, grid), "one launch a phase, 1 program": (alone, 1),
                "all phases in one launch": ([(0, 4, True)], grid),
                "all phases in one launch, 1 program": ([(0, 4, True)], 1),
                "all phases in one launch, every thread fences": ([(0, 4, True)], grid, 1),
                "all phases in one launch, every thread fences after the wait only": (
                    [(0, 4, True)], grid, 2)}
    for p in range(4 if pairs else 0):
        variants[f"phases {p}+{p + 1} in one launch"] = (
            alone[:p] + [(p, p + 1, True)] + alone[p + 2:], grid)
    base = run(*variants["one launch a phase"])
    rows = []
    for name, (launches, programs, *fence) in variants.items():
        got = run(launches, programs, *fence)
        diffs = [f"{(got[k].float() - base[k].float()).abs().max().item():.3g}" for k in base]
        err = ((got["x"].float() - ref).norm() / ref.norm()).item()
        rows.append([f"{shape} {str(dtype)[6:]}", name, str(programs), *diffs, f"{err:.2e}"])
    rows.append([shape, f"barrier timed out: {timed_out(counter)}", "", "", "", "", "", "", "",
                 ""])
    return rows


def run(args: argparse.Namespace, out: Path) -> dict:
    if not torch.cuda.is_available():
        print("persistent-check needs CUDA (no GPU here); nothing checked.")
        return {"measured": False}
    dtype = getattr(torch, args.dtype)
    rows = []
    for shape in args.shapes.split(","):
        rows += check(shape, dtype, args.pairs)
    head = ["shape", "launches", "programs", "max|d| q", "k", "v", "attn", "act", "x",
            "x rel err vs fp32 torch"]
    sections = [report.markdown_table(head, rows, align="lll" + "r" * 7)]
    report.emit(out, "persistent_check", "Persistent layer: one launch vs one a phase",
                sections, {"rows": rows})
    return {"rows": rows}
