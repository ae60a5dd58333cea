"""The persistent decode layer (engine/model/persistent_layer.py, `fused_layer: persistent`,
issue 22): one Triton launch a decoder layer with grid barriers between its phases.

- Interpreter (CPU, fp32; ``test_interp_*`` run in the TRITON_INTERPRET=1 child the parent test
  starts): the whole model on a mixed prefill + decode + padding flat batch, each layer run
  phase by phase (programs striding over several tiles), against the torch path; logits and
  every K/V cache.
- Host only: a real sm_90 compile of the one-launch kernel (the barrier's release add, spin
  and acquire are in it, and not in the phased kernel; shared memory for one program per SM).
- CUDA (bf16, SmolLM2-135M and Llama-3.2-1B layer shapes): the one-launch kernel over three
  layers against the same kernel one phase a launch (bit-equal: the same tiles, the barrier
  only orders them), against the `five` layer's kernels (within bf16 rounding), and replayed
  from a CUDA graph (the barrier counter reset each replay).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from sm90 import NO_PTXAS, compile_sm90, ptxas_available, signature
from test_fused_ops import (
    IN_INTERPRETER,
    flat_batch,
    interp_only,
    needs_cuda,
    rel_err,
    run_interpreter_child,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_persistent_layer_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert re.search(r"\b3 passed", proc.stdout) and "skipped" not in proc.stdout, report


def count_launches(monkeypatch) -> list[tuple[int, int, bool]]:
    """Wraps the persistent kernel: one (FIRST, LAST, SYNC) entry per launch."""
    from engine.model import persistent_layer

    calls: list[tuple[int, int, bool]] = []
    real = persistent_layer._persistent_layer_kernel

    class Counted:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                calls.append((kw["FIRST"], kw["LAST"], kw["SYNC"]))
                return real[grid](*args, **kw)
            return launch
    monkeypatch.setattr(persistent_layer, "_persistent_layer_kernel", Counted())
    return calls


@interp_only
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_interp_model_forward_matches_torch_path(family, monkeypatch) -> None:
    """A flat batch of a 5-token prefill chunk, one decode at position 9 and a padding token
    through the whole model in mode persistent (every layer phase by phase, 3 programs striding
    over the tiles) against the torch path (torch twins and the reference attention): logits
    and every layer's K/V cache; the whole-model kernel (one program, no barrier here) equals
    it bit for bit. Mistral with a sliding window of 4 (the decode sees 4 keys);
    Qwen2 with the qkv bias."""
    from engine.model import fused_gemm, fused_ops, fused_rope, llama, persistent_step

    extra = {"sliding_window": 4} if family == "mistral" else {}
    hf, model, run = flat_batch(family, **extra)
    c = hf.config
    kvh, d = c.num_key_value_heads, c.hidden_size // c.num_attention_heads

    model.set_fused_path(llama.FusedPath("persistent"))
    launches = count_launches(monkeypatch)
    got, got_kv = run()
    assert launches == [(p, p, False) for p in range(5)] * c.num_hidden_layers
    monkeypatch.setenv(persistent_step.WHOLE_MODEL_ENV, "1")  # one launch, all layers
    model.set_fused_path(llama.FusedPath("persistent"))
    whole, whole_kv = run()
    assert len(launches) == 5 * c.num_hidden_layers, "the whole-model kernel did not run"
    assert torch.equal(whole, got)
    for (gk, gv), (wk, wv) in zip(got_kv, whole_kv, strict=True):
        assert torch.equal(gk, wk) and torch.equal(gv, wv)
    assert persistent_step._tiles(7, torch.device("cpu"), torch.float32, c.hidden_size,
                                  c.intermediate_size, (c.num_attention_heads + 2 * kvh) * d,
                                  c.num_attention_heads, kvh, d, 4).programs == 3
    for mod in (fused_ops, fused_gemm, fused_rope, persistent_step):
        monkeypatch.setattr(mod, "use_triton", lambda x: False)
    model.set_fused_path(llama.FusedPath("plain"))
    want, want_kv = run()
    assert got.shape == want.shape == (1, 2, c.vocab_size)
    assert rel_err(got, want) < 1e-4
    for (gk, gv), (wk, wv) in zip(got_kv, want_kv, strict=True):
        assert rel_err(gk, wk) < 1e-5 and rel_err(gv, wv) < 1e-5


SM90_SHAPES = {  # H, KVH, D and the H200's tiles (persistent_step._tiles with gemm_table.json)
    "smollm2": (9, 3, 64, dict(qkv=(16, 256), o=(16, 256), gate_up=(32, 128), down=(16, 256))),
    "llama1b": (32, 8, 64, dict(qkv=(16, 512), o=(16, 512), gate_up=(32, 128), down=(16, 512))),
}


def compile_layer_sm90(heads: int, kvh: int, d: int, tiles: dict, sync: bool):
    from engine.model import persistent_layer as pl

    kernel = pl._persistent_layer_kernel
    const = _const(heads, kvh, d, tiles, sync)
    ints = {"rope_pos_ptr", "tok_pos_ptr", "req_ptr", "bt_ptr", "bar_ptr"}
    sig = signature(kernel, const, lambda n: (
        ("*i64" if n in ("slot_ptr", "clk_ptr") else "*i32" if n in ints else "*bf16")
        if n.endswith("_ptr") else "fp32" if n in ("eps", "scale_log2") else "i32"))
    unaligned = ("T", "bar_base", "eps", "scale_log2", "window", "max_blocks")
    aligned = [n for n in kernel.arg_names if sig[n] != "constexpr" and n not in unaligned]
    return compile_sm90(kernel, const, sig, aligned, num_warps=4,
                        num_stages=pl.LayerTiles._field_defaults["num_stages"])


def _const(heads: int, kvh: int, d: int, tiles: dict, sync: bool) -> dict:
    import triton

    g = heads // kvh
    g_pad = triton.next_power_of_2(g)
    return dict(H=heads, KVH=kvh, D=d, CACHE_BLOCK=16, G=g, G_PAD=g_pad,
                BLOCK_Q=max(1, 16 // g_pad), ATT_BN=64, HAS_WINDOW=False, IEEE_DOT=False,
                TABLE_AHEAD=True, QKV_BIAS=False, O_BIAS=False, GU_BIAS=False, DN_BIAS=False,
                BLOCK_M=16, NORM_BK=512, QKV_BN=tiles["qkv"][0] // 2, QKV_BK=tiles["qkv"][1],
                QKV_IL=tiles["qkv"][0] == 16, O_BN=tiles["o"][0], O_BK=tiles["o"][1],
                GU_BN=tiles["gate_up"][0], GU_BK=tiles["gate_up"][1], DN_BN=tiles["down"][0],
                DN_BK=tiles["down"][1],
                FIRST=0 if sync else 2, LAST=4 if sync else 2, SYNC=sync, PREFETCH=sync,
                CLOCK=False, FENCE=int(sync))


def _stack_bytes(cubin: bytes, tmp_path: Path) -> int | None:
    """Per-thread stack (register spills) of a cubin, read with Triton's cuobjdump."""
    import subprocess

    tool = Path(sys.modules["triton"].__file__).parent / "backends/nvidia/bin/cuobjdump"
    if not tool.exists():
        return None
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([str(tool), "-res-usage", str(path)], capture_output=True, text=True)
    found = re.search(r"STACK:(\d+)", out.stdout)
    return int(found.group(1)) if found else None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or IN_INTERPRETER,
                    reason="on a GPU the cuda tests compile and run the kernel for real")
@pytest.mark.skipif(not ptxas_available(), reason=NO_PTXAS)
@pytest.mark.parametrize("shape", sorted(SM90_SHAPES))
def test_one_launch_kernel_compiles_for_sm90_with_its_barrier(shape, tmp_path) -> None:
    """The real compile at the H200's tiles: the barrier's release add, volatile spin and
    acquire load are there (4 barriers: one a phase boundary), so is the L2 prefetch; the
    phased kernel has none of them; one program fits an SM's shared memory with room (the grid
    must be co-resident) and spills no register."""
    one = compile_layer_sm90(*SM90_SHAPES[shape], sync=True)
    ptx = one.asm["ptx"]
    assert len(re.findall(r"red\.global\.gpu\.release\.add", ptx)) == 4
    assert len(re.findall(r"ld\.global\.gpu\.acquire", ptx)) == 4
    assert "ld.volatile.global" in ptx
    assert "prefetch.global.L2" in ptx  # PREFETCH (compiled in with the barrier here)
    assert len(re.findall(r"fence\.sc\.gpu", ptx)) >= 8  # FENCE: every thread, both sides
    assert "ld.global.nc" not in ptx  # activations written by other programs: never non-coherent
    assert one.metadata.shared <= 128 * 1024
    assert _stack_bytes(one.asm["cubin"], tmp_path) in (0, None)
    phased = compile_layer_sm90(*SM90_SHAPES[shape], sync=False).asm["ptx"]
    assert not re.search(r"release|acquire|prefetch|fence", phased)


def compile_model_sm90(heads: int, kvh: int, d: int, tiles: dict):
    """The whole-model kernel (engine/model/persistent_model.py) at the same constexprs."""
    from engine.model import persistent_layer as pl
    from engine.model import persistent_model as pm

    kernel = pm._persistent_model_kernel
    const = {k: v for k, v in _const(heads, kvh, d, tiles, True).items()
             if k not in ("FIRST", "LAST")}
    const["NCOL"] = len(pm.COLUMNS)
    kinds = {"tbl_ptr": "*i64", "slot_ptr": "*i64", "clk_ptr": "*i64", "rope_pos_ptr": "*i32",
             "tok_pos_ptr": "*i32", "req_ptr": "*i32", "bt_ptr": "*i32", "bar_ptr": "*i32"}
    sig = signature(kernel, const, lambda n: kinds.get(n, "*bf16") if n.endswith("_ptr")
                    else "fp32" if n in ("eps", "scale_log2") else "i32")
    unaligned = ("T", "L", "eps", "scale_log2", "window", "max_blocks")
    aligned = [n for n in kernel.arg_names if sig[n] != "constexpr" and n not in unaligned]
    return compile_sm90(kernel, const, sig, aligned, num_warps=4,
                        num_stages=pl.LayerTiles._field_defaults["num_stages"])


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or IN_INTERPRETER,
                    reason="on a GPU the cuda tests compile and run the kernel for real")
@pytest.mark.skipif(not ptxas_available(), reason=NO_PTXAS)
def test_whole_model_kernel_keeps_the_vector_loads() -> None:
    """The pointers the whole-model kernel reads from its table (offsets declared multiples
    of 8 elements) still give 16-byte cp.async weight loads, as many as the one-layer
    kernel's; 5 barriers (4 in a layer, 1 between layers)."""
    shape = SM90_SHAPES["smollm2"]
    whole = compile_model_sm90(*shape).asm["ptx"]
    layer = compile_layer_sm90(*shape, sync=True).asm["ptx"]
    cp16 = r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10"
    assert len(re.findall(cp16, whole)) == len(re.findall(cp16, layer)) > 0
    assert len(re.findall(r"red\.global\.gpu\.release\.add", whole)) == 5


# ----------------------------------------------------------------------------------- CUDA

CUDA_SHAPES = {  # hidden, heads, kv heads, head_dim, intermediate, tokens, context
    "smollm2-135m-b16": (576, 9, 3, 64, 1536, 16, 264),
    "llama-3.2-1b-b1": (2048, 32, 8, 64, 8192, 1, 264),
}


def _cuda_layer_case(hidden, heads, kvh, d, inter, t, context, layers=3):
    from engine.attention.interface import AttnContext
    from engine.attention.triton_paged import paged_attention
    from engine.model.llama import FusedDecoderLayer

    g = torch.Generator(device="cuda").manual_seed(hidden + t)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=g, device="cuda")  # noqa: E731
                                 * scale).bfloat16()
    mk = lambda: FusedDecoderLayer(  # noqa: E731
        input_norm=1 + rnd(hidden, scale=0.1), qkv=rnd((heads + 2 * kvh) * d, hidden,
                                                       scale=hidden ** -0.5),
        qkv_bias=None, qk_norm=None, o=rnd(hidden, heads * d, scale=(heads * d) ** -0.5),
        o_bias=None, post_norm=1 + rnd(hidden, scale=0.1),
        gate_up=rnd(2 * inter, hidden, scale=hidden ** -0.5), gate_up_bias=None,
        down=rnd(hidden, inter, scale=inter ** -0.5), down_bias=None, sliding_window=None,
        scaling=d ** -0.5)
    stack = [mk() for _ in range(layers)]
    block, per_req = 16, -(-(context + 1) // 16)
    blocks = t * per_req + 1
    kv = [(rnd(blocks, block, kvh, d), rnd(blocks, block, kvh, d)) for _ in range(layers)]
    bt = torch.arange(t * per_req, dtype=torch.int32, device="cuda").view(t, per_req)
    pos = torch.full((t,), context, dtype=torch.int32, device="cuda")
    slots = (bt[:, context // block].long() * block + context % block)
    ctx = AttnContext(kv_caches=kv, slot_mapping=slots, block_tables=bt,
                      token_req=torch.arange(t, dtype=torch.int32, device="cuda"),
                      token_pos=pos, backend=paged_attention)
    cos_sin = rnd(context + 8, 2, d // 2)
    return stack, ctx, cos_sin, rnd(t, hidden)


def _tiles_for(stack, ctx, x, heads):
    from engine.model.persistent_step import _tiles

    k0 = ctx.kv_caches[0][0]
    t, hidden = x.shape
    return _tiles(t, x.device, x.dtype, hidden, stack[0].gate_up.shape[0] // 2,
                  stack[0].qkv.shape[0], heads, k0.shape[2], k0.shape[3], 2)


def _run_persistent(stack, ctx, cos_sin, x, heads, phased, counter, prefetch_bytes=0):
    from engine.model.persistent_layer import BARRIERS_PER_LAYER, persistent_layer

    tiles = _tiles_for(stack, ctx, x, heads)
    counter[:1].zero_()
    for i, layer in enumerate(stack):
        x = persistent_layer(layer, x, ctx.token_pos, ctx, ctx.kv_caches[i], cos_sin, heads,
                             1e-5, tiles, counter, i * BARRIERS_PER_LAYER, phased=phased,
                             next_qkv=stack[(i + 1) % len(stack)].qkv,
                             prefetch_bytes=prefetch_bytes)
    return x


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape", sorted(CUDA_SHAPES))
def test_cuda_one_launch_equals_phased_and_five(shape) -> None:
    """bf16, three layers: one launch a phase and the one-launch kernel each within bf16
    rounding of the `five` layer's kernels (which of them is wrong, if one is); the one-launch
    kernel (barriers; with and without the L2 weight prefetch) and the one launch for all three
    layers (engine/model/persistent_model.py) give the same bits as one launch a phase (hidden
    state and caches); a CUDA graph of the one-launch step replays to the same bits twice."""
    from types import SimpleNamespace

    from engine.model.llama import FusedPath
    from engine.model.persistent_barrier import new_counter, timed_out
    from engine.model.persistent_model import LayerTable, persistent_model

    hidden, heads, kvh, d, inter, t, context = CUDA_SHAPES[shape]
    stack, ctx, cos_sin, x0 = _cuda_layer_case(hidden, heads, kvh, d, inter, t, context)
    caches0 = [(k.clone(), v.clone()) for k, v in ctx.kv_caches]
    counter = new_counter(x0.device)

    def fresh():
        for (k, v), (k0, v0) in zip(ctx.kv_caches, caches0, strict=True):
            k.copy_(k0)
            v.copy_(v0)
        return x0.clone()

    x, residual = fresh(), None
    for i, layer in enumerate(stack):  # the conventional five layer: the oracle
        layer.path = FusedPath("five")
        x, residual = layer(x, residual, ctx.token_pos, ctx, ctx.kv_caches[i], cos_sin, heads,
                            1e-5)
    assert residual is None
    phased = _run_persistent(stack, ctx, cos_sin, fresh(), heads, True, counter)
    phased_kv = [(k.clone(), v.clone()) for k, v in ctx.kv_caches]
    one = _run_persistent(stack, ctx, cos_sin, fresh(), heads, False, counter)
    torch.cuda.synchronize()
    errs = (rel_err(phased, x), rel_err(one, x))
    print(f"{shape}: rel err vs five: one launch a phase {errs[0]:.2e}, one launch {errs[1]:.2e}"
          f", max |one - phased| {(one.float() - phased.float()).abs().max().item():.3g}")
    assert not timed_out(counter), "a barrier gave up waiting: grid not co-resident"
    assert errs[0] < 2e-2, "one launch a phase is wrong"
    assert errs[1] < 2e-2, "the one-launch kernel is wrong (one launch a phase is right)"
    for prefetch in (0, 64 << 20):
        one = _run_persistent(stack, ctx, cos_sin, fresh(), heads, False, counter, prefetch)
        torch.cuda.synchronize()
        assert torch.equal(one, phased), f"max diff {(one.float() - phased.float()).abs().max()}"
        for (k, v), (pk, pv) in zip(ctx.kv_caches, phased_kv, strict=True):
            assert torch.equal(k, pk) and torch.equal(v, pv)
    model = SimpleNamespace(layers=stack, cos_sin=cos_sin, num_heads=heads, eps=1e-5)
    whole = fresh()
    counter[:1].zero_()
    assert persistent_model(model, LayerTable(), whole, ctx.token_pos, ctx,
                            _tiles_for(stack, ctx, whole, heads), counter, 0)
    torch.cuda.synchronize()
    assert not timed_out(counter), "a barrier of the whole-model launch gave up waiting"
    assert torch.equal(whole, phased), f"whole: {(whole.float() - phased.float()).abs().max()}"
    for (k, v), (pk, pv) in zip(ctx.kv_caches, phased_kv, strict=True):
        assert torch.equal(k, pk) and torch.equal(v, pv)
    graph, x_in = torch.cuda.CUDAGraph(), fresh()
    out_ref = _run_persistent(stack, ctx, cos_sin, x_in.clone(), heads, False, counter)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fresh()
        buf = x_in.clone()
        with torch.cuda.graph(graph, stream=stream):
            out = _run_persistent(stack, ctx, cos_sin, buf, heads, False, counter)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        fresh()
        buf.copy_(x_in)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, out_ref)
    assert not timed_out(counter)
