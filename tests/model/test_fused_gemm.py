"""The fused decode GEMM (engine/model/fused_gemm.py: norm prologue, SiLU*up or residual
epilogue): the Triton kernel against its torch twin (interpreter on CPU in fp32, real kernel on
CUDA in bf16), a whole model forward under `decode_layer: fused` against the cublas path for the
Llama, Mistral, Qwen2 and Qwen3 tiny configs, and greedy equality with generate through the
engine (CPU torch twins; CUDA in bf16, graphs off and on).

``test_interp_*`` run only in the TRITON_INTERPRET=1 child the parent test starts (Triton reads
the variable at import). Outputs are poisoned with NaN, so an element left unwritten fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
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
def test_fused_linear_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def _check_linear(dtype, device, m, k, n, bias, norm, pair, residual, tol, config=None,
                  pdl=False):
    from engine.model import fused_gemm

    g = torch.Generator().manual_seed(m * 11 + n + k)
    h = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn((2 if pair else 1) * n, k, generator=g) / k ** 0.5).to(device, dtype)
    b = torch.randn(w.shape[0], generator=g).to(device, dtype) if bias else None
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype) if norm else None
    r = torch.randn(m, n, generator=g).to(device, dtype) if residual else None
    kw = dict(norm=nw, eps=1e-5, pair=pair, residual=r)
    want = fused_gemm.fused_linear_torch(h, w, b, **kw)
    got = fused_gemm.fused_linear(h, w, b, **kw, config=config, pdl=pdl)
    assert got.shape == want.shape == (m, n)
    assert rel_err(got, want) < tol


@interp_only
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 96), (20, 100, 40)])
@pytest.mark.parametrize(("norm", "pair", "residual"),
                         [(True, False, False), (True, True, False), (False, False, True),
                          (False, True, True)])
@pytest.mark.parametrize("bias", [False, True])
def test_interp_fused_linear(m, k, n, norm, pair, residual, bias) -> None:
    _check_linear(torch.float32, "cpu", m, k, n, bias, norm, pair, residual, 1e-5)


@interp_only
@pytest.mark.parametrize(("m", "k", "n"), [(3, 200, 72), (17, 64, 40)])
@pytest.mark.parametrize("config", [(16, 256, 4, 3), (32, 32, 2, 2), (64, 128, 4, 4)])
def test_interp_fused_linear_tile_configs(m, k, n, config) -> None:
    """The sweep's tile configurations: N and K not multiples of the tiles, several programs
    over N, the norm pass and the K loop in more than one step."""
    from engine.model.gemm_table import GemmConfig

    cfg = GemmConfig(*config)
    for norm, pair, residual in [(True, True, False), (False, False, True)]:
        _check_linear(torch.float32, "cpu", m, k, n, False, norm, pair, residual, 1e-5, cfg)


def _check_add_norm(dtype, device, m, k, n, pair, tol, config=None, pdl=False):
    """The pending residual add in the norm prologue: the GEMM's output and the sum."""
    from engine.model import fused_gemm

    g = torch.Generator().manual_seed(m * 13 + n + k)
    h = torch.randn(m, k, generator=g).to(device, dtype)
    add = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn((2 if pair else 1) * n, k, generator=g) / k ** 0.5).to(device, dtype)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(device, dtype)
    x = add + h
    want = fused_gemm.fused_linear_torch(x, w, None, norm=nw, eps=1e-5, pair=pair)
    got, got_x = fused_gemm.fused_add_norm_linear(h, add, w, None, norm=nw, eps=1e-5,
                                                  pair=pair, config=config, pdl=pdl)
    assert got.shape == want.shape == (m, n)
    assert torch.equal(got_x, x)
    assert rel_err(got, want) < tol


@interp_only
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 96), (20, 200, 40)])
@pytest.mark.parametrize("pair", [False, True])
def test_interp_fused_add_norm_linear(m, k, n, pair) -> None:
    from engine.model.gemm_table import GemmConfig

    _check_add_norm(torch.float32, "cpu", m, k, n, pair, 1e-5, GemmConfig(16, 64, 4, 3))


@interp_only
@pytest.mark.parametrize("rotary", [False, True])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_interp_model_forward_fused_matches_cublas_path(family, rotary, monkeypatch):
    """A mixed prefill+decode flat batch: `decode_layer: fused` (Triton ops, interpreted), with
    and without the rotary epilogue, vs the cublas path's torch ops (the oracle)."""
    from engine.model import fused_gemm, fused_ops, fused_rope, llama

    hf, model, run = flat_batch(family)
    model.set_fused_path(llama.FusedPath("fused", rotary=rotary))
    calls, rope_calls = [], []

    class Counted:
        def __init__(self, real, log):
            self.real, self.log = real, log

        def __getitem__(self, grid):
            self.log.append(1)
            return self.real[grid]
    monkeypatch.setattr(fused_gemm, "_fused_linear_kernel",
                        Counted(fused_gemm._fused_linear_kernel, calls))
    monkeypatch.setattr(fused_rope, "_fused_linear_rope_kernel",
                        Counted(fused_rope._fused_linear_rope_kernel, rope_calls))
    got, _ = run()
    # the fused kernels ran in every layer: o, gate_up, down and the qkv GEMM, with rotary +
    # the KV write in its epilogue where asked and the model fits it (Qwen3's q/k norm: not)
    layers = hf.config.num_hidden_layers
    rope = rotary and family != "qwen3"
    assert len(calls) == (3 if rope else 4) * layers
    assert len(rope_calls) == (layers if rope else 0)
    model.set_fused_path(llama.FusedPath("cublas"))
    monkeypatch.setattr(fused_ops, "use_triton", lambda x: False)
    want, _ = run()
    assert rel_err(got, want) < 1e-4


@needs_cuda
@pytest.mark.cuda
def test_cuda_fused_linear_bf16() -> None:
    for m in (1, 16, 32, 200):
        _check_linear(torch.bfloat16, "cuda", m, 2048, 8192, False, False, True, False, 1e-2)
    _check_linear(torch.bfloat16, "cuda", 5, 896, 4864, True, False, True, False, 1e-2)
    for norm, pair, residual in [(True, False, False), (True, True, False),
                                 (False, False, True)]:
        for m in (1, 32, 200):
            _check_linear(torch.bfloat16, "cuda", m, 2048, 2048, False, norm, pair, residual,
                          1e-2)


@pytest.mark.skipif(IN_INTERPRETER, reason="the torch path, not the interpreter")
@pytest.mark.parametrize(("family", "fused_kinds"),
                         [("llama", "all"), ("mistral", "all"), ("qwen2", "all"),
                          ("qwen3", "all"), ("llama", "norm_pair"), ("qwen2", "norm")])
def test_fused_layer_torch_path_greedy_equals_generate(family, fused_kinds, tmp_path,
                                                       monkeypatch):
    """The fused layer's restructured residual stream (the hidden state carried whole,
    residual adds in the o/down epilogues, norms in the next GEMM's prologue; the separate
    rotary kernel) through the engine on CPU (torch twins): greedy tokens equal generate's,
    preemption forced. With fused_kinds other than "all", decode_layer "auto" with a stand-in
    table that picks the fused kernel
    only for those kinds and cuBLAS + separate ops elsewhere: the residual add a cuBLAS o or
    down leaves pending is done by the next norm (add_rms_norm, or the fused kernel's add
    prologue, which `fused_add_norm_linear` must then run)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    sys.path.insert(0, str(REPO_ROOT / "tests" / "engine"))
    from engine_checks import cpu_engine_outputs, hf_greedy, mixed_prompts
    from tiny_models import save_tiny_model

    from engine.model import fused_gemm, gemm_table, llama

    layer = "fused"
    if fused_kinds != "all":
        layer, kinds = "auto", fused_kinds.split(",")
        cfg16 = gemm_table.GemmConfig(16, 64, 4, 3)
        monkeypatch.setattr(gemm_table, "choose",
                            lambda layer, kind, *a: cfg16 if kind in kinds else None)
    calls, add_calls = [], []
    real = fused_gemm.fused_linear_torch
    monkeypatch.setattr(fused_gemm, "fused_linear_torch",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    real_add = fused_gemm.fused_add_norm_linear
    monkeypatch.setattr(llama, "fused_add_norm_linear",
                        lambda *a, **k: add_calls.append(1) or real_add(*a, **k))
    model_dir = save_tiny_model(family, tmp_path, **({"sliding_window": 16}
                                                     if family == "mistral" else {}))
    prompts = mixed_prompts(9)
    expected = hf_greedy(model_dir, prompts, 12)
    tokens, stats = cpu_engine_outputs(model_dir, prompts, 12, decode_layer=layer,
                                       fused_rotary=False)
    assert calls, "the fused layer did not run"
    assert bool(add_calls) == (fused_kinds != "all"), "the pending add took the wrong path"
    assert stats["preemptions"] > 0
    assert tokens == expected


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize(("layer", "pdl"), [("fused", False), ("fused", True), ("auto", True)])
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_greedy_fused_separate_rotary_equals_generate(graphs, layer, pdl, tiny_model_dir):
    """bf16 on the GPU with the separate rotary kernel (fused_rotary false): exactly generate's
    tokens."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "engine"))
    from engine_checks import cuda_engine_outputs, hf_greedy, mixed_prompts

    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(9, seed=5)
    expected = hf_greedy(model_dir, prompts, 12, "cuda", torch.bfloat16)
    got, _, settings = cuda_engine_outputs(model_dir, prompts, 12, async_batching=False,
                                           cuda_graphs=graphs, model_impl="gapless",
                                           decode_layer=layer, fused_rotary=False,
                                           fused_pdl=pdl)
    assert settings["model_impl"] == "gapless"
    assert got == expected


@needs_cuda
@pytest.mark.cuda
def test_cuda_fused_linear_tile_configs_and_pdl() -> None:
    """Every configuration the sweep tries, with and without programmatic dependent launch."""
    from engine.model.gemm_table import GemmConfig

    sys.path.insert(0, str(REPO_ROOT))
    from bench.suites.fused_sweep import CONFIGS

    for i, config in enumerate(CONFIGS):
        cfg = GemmConfig(*config)
        for norm, pair, residual in [(True, True, False), (False, False, True)]:
            for m in (1, 32):
                _check_linear(torch.bfloat16, "cuda", m, 576, 1536, False, norm, pair,
                              residual, 1e-2, cfg, pdl=i % 2 == 0)
        if i % 3 == 0:  # a few: each is one more compile
            _check_add_norm(torch.bfloat16, "cuda", 16, 576, 960, False, 1e-2, cfg, i % 2 == 0)


@pytest.mark.skipif(IN_INTERPRETER, reason="host-side only")
def test_gemm_table_choice(tmp_path) -> None:
    """`auto` takes the fused kernel only where the table measured it faster on this GPU (its
    PDL time with PDL on); cuBLAS on another GPU, an unmeasured shape or M above the buckets;
    `fused` always the fused kernel, with the heuristic where unmeasured."""
    import json

    from engine.model import gemm_table as gt

    entries = {"norm:960x576:m16": dict(config=[16, 256, 4, 3], triton_us=3.0, pdl_us=2.0,
                                         cublas_us=5.0),
               "residual:576x576:m16": dict(config=[32, 128, 4, 4], triton_us=4.0,
                                            pdl_us=2.5, cublas_us=3.0)}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "GPU X", "entries": entries}))
    t = str(path)
    assert gt.choose("auto", "norm", 960, 576, 9, "GPU X", False, t) == (16, 256, 4, 3)
    assert gt.choose("auto", "residual", 576, 576, 16, "GPU X", False, t) is None
    assert gt.choose("auto", "residual", 576, 576, 16, "GPU X", True, t) == (32, 128, 4, 4)
    assert gt.choose("auto", "norm", 960, 576, 16, "GPU Y", False, t) is None
    assert gt.choose("auto", "norm", 960, 576, 33, "GPU X", False, t) is None
    assert gt.choose("auto", "norm_pair", 1536, 576, 16, "GPU X", False, t) is None
    assert gt.choose("auto", "norm", 960, 576, 9, "GPU X") is None  # the shipped table: no GPU X
    assert gt.choose("cublas", "norm", 960, 576, 16, "GPU X", False, t) is None
    assert gt.choose("fused", "norm", 960, 576, 1, None, False, t) == gt.heuristic_config(960,
                                                                                          576)
    assert gt.choose("fused", "residual", 576, 576, 16, "GPU X", False, t) == (32, 128, 4, 4)
    assert gt.heuristic_config(576, 576).block_n == 16  # 36 programs, not 9
