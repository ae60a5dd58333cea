"""The qkv GEMM with rotary and the KV-cache write in its epilogue (engine/model/fused_rope.py):
the Triton kernel against its torch twin (the fused norm-prologue GEMM's twin, then
rope_and_cache_torch) under the interpreter in fp32 and on CUDA in bf16, for Llama / Mistral /
Qwen2-like head layouts (GQA, MHA, bias, head_dim not a power of two, N and K not multiples of
the tiles, the pending residual add in the prologue). Through the engine (greedy tokens against
transformers): tests/model/test_fused_rope_engine.py.

``test_interp_*`` run only in the TRITON_INTERPRET=1 child the parent test starts (Triton reads
the variable at import). q is compared element by element and the caches whole: slots the
kernel must not touch have to stay bit-equal.
"""

from __future__ import annotations

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
def test_qkv_rope_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def _check_rope(dtype, device, m, k, heads, kvh, d, *, bias=False, add=False, norm=True,
                config=None, pdl=False, tol=1e-5):
    """fused_qkv_rope against its twin: q, the residual sum, both caches whole."""
    from engine.model import fused_rope

    n = (heads + 2 * kvh) * d
    g = torch.Generator().manual_seed(m * 17 + n + k)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    h = rnd(m, k).to(device, dtype)
    a = rnd(m, k).to(device, dtype) if add else None
    w = (rnd(n, k) / k ** 0.5).to(device, dtype)
    b = rnd(n).to(device, dtype) if bias else None
    nw = (1 + 0.1 * rnd(k)).to(device, dtype) if norm else None
    cos_sin = rnd(64, 2, d // 2).to(device, dtype)
    pos = torch.randint(0, 64, (m,), generator=g, dtype=torch.int32).to(device)
    block, n_blocks = (16 if device == "cuda" else 4), m // 2 + 3  # 16: as the sweep's
    slots = torch.randperm(n_blocks * block, generator=g)[:m].to(device)  # int64, distinct
    k_cache = rnd(n_blocks, block, kvh, d).to(device, dtype)
    v_cache = rnd(n_blocks, block, kvh, d).to(device, dtype)
    kc, vc = k_cache.clone(), v_cache.clone()
    kw = dict(norm=nw, eps=1e-5, cos_sin=cos_sin, positions=pos, slot_mapping=slots,
              num_heads=heads)
    got_q, got_x = fused_rope.fused_qkv_rope(h, a, w, b, k_cache=kc, v_cache=vc, **kw,
                                             config=config, pdl=pdl)
    want_q, want_x = fused_rope.fused_qkv_rope_torch(h, a, w, b, k_cache=k_cache,
                                                     v_cache=v_cache, **kw)
    assert got_q.shape == want_q.shape == (m, heads, d)
    assert rel_err(got_q, want_q) < tol
    assert (got_x is None) == (not add)
    if add:
        assert torch.equal(got_x, want_x)
    written = torch.zeros(n_blocks * block, dtype=torch.bool, device=device)
    written[slots] = True
    for got_c, want_c in ((kc, k_cache), (vc, v_cache)):
        got_c, want_c = got_c.view(-1, kvh, d), want_c.view(-1, kvh, d)
        assert torch.equal(got_c[~written], want_c[~written]), "a slot not in slot_mapping"
        assert rel_err(got_c[written], want_c[written]) < tol


# (heads, kv heads, head_dim, K): the tiny Llama / Mistral / Qwen2 configs' layout (GQA 4:2,
# D 16), MHA, an odd GQA 5:1 with D 12 (N = 84: half columns not a multiple of 16, heads split
# across tiles), K not a multiple of the K tile.
LAYOUTS = [(4, 2, 16, 64), (3, 3, 8, 48), (5, 1, 12, 100)]


@interp_only
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("m", [1, 7, 70])
@pytest.mark.parametrize(("bias", "add"), [(False, False), (True, True), (False, True)])
def test_interp_qkv_rope(layout, m, bias, add) -> None:
    heads, kvh, d, k = layout
    _check_rope(torch.float32, "cpu", m, k, heads, kvh, d, bias=bias, add=add)


@interp_only
@pytest.mark.parametrize("config", [(16, 64, 4, 3), (16, 32, 2, 2), (32, 32, 4, 3),
                                    (64, 64, 2, 2), (128, 256, 4, 4)])
def test_interp_qkv_rope_tile_configs(config) -> None:
    """The sweep's kind of configurations: one or several K steps, tiles wider than a head;
    block_n 16 is the interleaved single accumulator, wider ones two accumulators."""
    from engine.model.gemm_table import GemmConfig

    for heads, kvh, d, k in LAYOUTS:
        _check_rope(torch.float32, "cpu", 20, k, heads, kvh, d, bias=True, add=True,
                    config=GemmConfig(*config))
    _check_rope(torch.float32, "cpu", 5, 64, 4, 2, 16, norm=False, config=GemmConfig(*config))


@interp_only
def test_interp_qkv_rope_rejects_narrow_tiles() -> None:
    from engine.model.gemm_table import GemmConfig

    with pytest.raises(ValueError, match="block_n >= 16"):
        _check_rope(torch.float32, "cpu", 2, 64, 4, 2, 16, config=GemmConfig(8, 64, 4, 3))


def _stand_in_choose(kinds):
    """gemm_table.choose for mode "auto" with a table that picks the fused kernel only for
    `kinds` (cuBLAS + separate ops elsewhere)."""
    from engine.model.gemm_table import GemmConfig

    def choose(layer, kind, n, k, m, name, pdl=False, table=None):
        if kind not in kinds:
            return None
        return GemmConfig(32, 64, 4, 3)
    return choose


@interp_only
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
@pytest.mark.parametrize("kinds", ["norm_rope", "norm_rope,residual,norm_pair"])
def test_interp_model_forward_with_rope_epilogue_matches_torch_path(family, kinds, monkeypatch):
    """A mixed prefill+decode flat batch through the whole model, decode_layer auto with a
    stand-in table: the rotary epilogue alone (cuBLAS elsewhere: the pending residual add in
    its prologue from the second layer on) or with the other fused GEMMs, against the cublas
    path's torch ops."""
    from engine.model import fused_ops, fused_rope, gemm_table, llama

    hf, model, run = flat_batch(family)
    c = hf.config
    monkeypatch.setattr(gemm_table, "choose", _stand_in_choose(kinds.split(",")))
    model.set_fused_path(llama.FusedPath("auto"))
    calls = []
    real = fused_rope.fused_qkv_rope
    monkeypatch.setattr(llama, "fused_qkv_rope",
                        lambda h, add, *a, **k: calls.append(add is not None)
                        or real(h, add, *a, **k))
    got, got_kv = run()
    assert calls == [False] + [kinds == "norm_rope"] * (c.num_hidden_layers - 1)
    model.set_fused_path(llama.FusedPath("cublas"))
    monkeypatch.setattr(fused_ops, "use_triton", lambda x: False)
    want, want_kv = run()
    assert rel_err(got, want) < 1e-4
    for (gk, gv), (wk, wv) in zip(got_kv, want_kv, strict=True):
        assert rel_err(gk, wk) < 1e-5 and rel_err(gv, wv) < 1e-5


# (heads, kv heads, head_dim, K) of SmolLM2-135M, Llama-3.2-1B, Llama-3.1-8B
MODEL_LAYOUTS = [(9, 3, 64, 576), (32, 8, 64, 2048), (32, 8, 128, 4096)]


@needs_cuda
@pytest.mark.cuda
def test_cuda_qkv_rope_bf16_configs_and_pdl() -> None:
    """bf16 on the GPU at the real models' shapes, every configuration the sweep tries for this
    kind (the variants the sweep compiles, so after it they come from Triton's cache), PDL on
    and off; then the pending add and the bias, and a prefill-sized M."""
    from engine.model.gemm_table import GemmConfig

    sys.path.insert(0, str(REPO_ROOT))
    from bench.suites.fused_sweep import ROPE_CONFIGS

    for i, config in enumerate(ROPE_CONFIGS):
        heads, kvh, d, k = MODEL_LAYOUTS[i % len(MODEL_LAYOUTS)]
        m = (1, 16, 32)[(i // len(MODEL_LAYOUTS)) % 3]
        _check_rope(torch.bfloat16, "cuda", m, k, heads, kvh, d, config=GemmConfig(*config),
                    pdl=i % 2 == 0, tol=1e-2)
    for config, m in ((ROPE_CONFIGS[0], 16), (ROPE_CONFIGS[-1], 5)):
        _check_rope(torch.bfloat16, "cuda", m, 576, 9, 3, 64, bias=True, add=True,
                    config=GemmConfig(*config), pdl=True, tol=1e-2)
    _check_rope(torch.bfloat16, "cuda", 200, 2048, 32, 8, 64, add=True, pdl=True, tol=1e-2)
    # the tiny test model's layout (D 16) in the configurations the engine tests run it with:
    # the fused layer's heuristic (interleaved, block_n 16) and the stand-in table's (two
    # accumulators)
    for config in ((16, 256, 4, 3), (32, 64, 4, 3)):
        _check_rope(torch.bfloat16, "cuda", 16, 64, 4, 2, 16, add=True,
                    config=GemmConfig(*config), tol=1e-2)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or IN_INTERPRETER,
                    reason="on a GPU the cuda tests compile and run the kernels for real")
@pytest.mark.parametrize(("use_gdc", "interleave", "pf_k"),
                         [(0, False, 0), (1, False, 0), (1, True, 0), (2, True, 576)])
def test_rope_kernel_compiles_for_sm90_without_a_gpu(use_gdc, interleave, pf_k) -> None:
    """Real compilation for an H100/H200 target (what the interpreter lets through: constexpr
    misuse, pointer types), with the launch specialisation a decode step gets (pointers and
    strides divisible by 16): the weight tiles load 16 bytes at a time through cp.async like
    the fused GEMM's, and PDL's wait/launch instructions are there when asked for."""
    if not ptxas_available():
        pytest.skip(NO_PTXAS)
    from engine.model import fused_rope

    kernel = fused_rope._fused_linear_rope_kernel
    const = dict(HALF=32, CACHE_BLOCK=16, NORM=True, ADD_IN=True, HAS_BIAS=True, BLOCK_M=16,
                 BLOCK_N=8 if interleave else 16, BLOCK_K=256, NORM_BK=512, USE_GDC=use_gdc,
                 INTERLEAVE=interleave, PF_K=pf_k)
    sig = signature(kernel, const, lambda n: (
        {"pos_ptr": "*i32", "slot_ptr": "*i64"}.get(n, "*bf16") if n.endswith("_ptr")
        else "fp32" if n == "eps" else "i32"))
    aligned = [n for n in kernel.arg_names
               if sig[n] != "constexpr" and n not in ("M", "H", "KVH", "eps")]
    compiled = compile_sm90(kernel, const, sig, aligned, num_warps=4, num_stages=3)
    ptx = compiled.asm["ptx"]
    assert "ld.global.v4" in ptx and "cp.async" in ptx
    assert ("griddepcontrol.wait" in ptx) == bool(use_gdc)
    assert ("griddepcontrol.launch_dependents" in ptx) == bool(use_gdc)
    assert ("prefetch.global.L2" in ptx) == (pf_k > 0)


@pytest.mark.skipif(IN_INTERPRETER, reason="host-side only")
def test_gemm_table_rope_choice(tmp_path) -> None:
    """auto takes the rotary epilogue only where it beat both two-kernel ways (cuBLAS + norm +
    rope_and_cache, and the fused qkv + rope_and_cache); fused always; fused_rotary false
    never (the separate rope+cache kernel keeps its rounding)."""
    import json

    from engine.model import gemm_table as gt
    from engine.model.llama import FusedPath

    entries = {"norm_rope:960x576:m16": dict(config=[64, 128, 4, 4], triton_us=5.0,
                                              pdl_us=4.5, cublas_us=6.0, split_us=4.8),
               "norm_rope:960x576:m1": dict(config=[32, 256, 4, 3], triton_us=5.0,
                                             pdl_us=4.5, cublas_us=4.4, split_us=6.0)}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "GPU X", "entries": entries}))
    t = str(path)
    assert gt.choose("auto", "norm_rope", 960, 576, 16, "GPU X", True, t) == (64, 128, 4, 4)
    assert gt.choose("auto", "norm_rope", 960, 576, 16, "GPU X", False, t) is None  # split
    assert gt.choose("auto", "norm_rope", 960, 576, 1, "GPU X", True, t) is None  # cuBLAS
    assert gt.choose("auto", "norm_rope", 960, 576, 16, "GPU Y", True, t) is None
    assert gt.choose("fused", "norm_rope", 960, 576, 1, "GPU Y", False, t) == \
        gt.heuristic_config(960, 576)
    x = torch.zeros(1, 576)
    assert FusedPath("fused").pick("norm_rope", 960, 576, x) == gt.heuristic_config(960, 576)
    assert FusedPath("fused", rotary=False).pick("norm_rope", 960, 576, x) is None
    assert FusedPath("fused", rotary=False).pick("norm", 960, 576, x) == \
        gt.heuristic_config(960, 576)
