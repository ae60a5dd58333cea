"""The gate_up GEMM with SiLU-and-mul in its epilogue (engine/model/fused_gemm.py):
the Triton kernel against its torch twin (interpreter on CPU in fp32, real kernel on CUDA in
bf16), a whole fused-model forward with the epilogue on vs the torch path for the Llama,
Mistral, Qwen2 and Qwen3 tiny configs, and on CUDA greedy bf16 equality with the epilogue on,
graphs off and on.

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
# the config key's values
MODES = {"FUSED_EPILOGUES": "epilogues", "FUSED_LAYER": "six", "FUSED_FIVE": "five"}


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_gate_up_silu_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def _check(dtype: torch.dtype, device: str, m: int, k: int, n: int, bias: bool, tol: float):
    from engine.model import fused_gemm

    g = torch.Generator().manual_seed(m * 7 + n)
    h = torch.randn(m, k, generator=g).to(device, dtype)
    w = (torch.randn(2 * n, k, generator=g) / k ** 0.5).to(device, dtype)
    b = torch.randn(2 * n, generator=g).to(device, dtype) if bias else None
    want = fused_gemm.gate_up_silu_torch(h, w, b)
    got = fused_gemm.gate_up_silu_triton(h, w, b)
    assert got.shape == want.shape == (m, n)
    assert rel_err(got, want) < tol


@interp_only
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 96), (7, 100, 40), (33, 64, 130)])
@pytest.mark.parametrize("bias", [False, True])
def test_interp_gate_up_silu(m, k, n, bias) -> None:
    _check(torch.float32, "cpu", m, k, n, bias, 1e-5)


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
@pytest.mark.parametrize("flag", ["FUSED_EPILOGUES", "FUSED_LAYER", "FUSED_FIVE"])
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_interp_model_forward_with_epilogue_matches_torch_path(family, flag, monkeypatch):
    """A mixed prefill+decode flat batch: the epilogue on (Triton ops, interpreted) vs the
    present path's torch ops (the oracle)."""
    from engine.model import fused_gemm, fused_ops, fused_rope, llama

    hf, model, run = flat_batch(family)
    model.set_fused_path(llama.FusedPath(MODES[flag]))
    calls, rope_calls = [], []

    class Counted:
        def __init__(self, real, log):
            self.real, self.log = real, log

        def __getitem__(self, grid):
            self.log.append(1)
            return self.real[grid]
    if flag == "FUSED_EPILOGUES":
        real = fused_gemm.gate_up_silu_triton
        monkeypatch.setattr(fused_gemm, "gate_up_silu_triton",
                            lambda *a: calls.append(1) or real(*a))
    else:
        monkeypatch.setattr(fused_gemm, "_fused_linear_kernel",
                            Counted(fused_gemm._fused_linear_kernel, calls))
        monkeypatch.setattr(fused_rope, "_fused_linear_rope_kernel",
                            Counted(fused_rope._fused_linear_rope_kernel, rope_calls))
    got, _ = run()
    # the fused kernels ran in every layer: 1 (gate_up+SiLU), or o, gate_up, down and the qkv
    # GEMM with rotary + the KV write in its epilogue (Qwen3's q/k norm: the plain fused qkv)
    layers = hf.config.num_hidden_layers
    rope = flag == "FUSED_FIVE" and family != "qwen3"
    per_layer = 1 if flag == "FUSED_EPILOGUES" else (3 if rope else 4)
    assert len(calls) == per_layer * layers
    assert len(rope_calls) == (layers if rope else 0)
    model.set_fused_path(llama.FusedPath("plain"))
    monkeypatch.setattr(fused_ops, "use_triton", lambda x: False)
    want, _ = run()
    assert rel_err(got, want) < 1e-4


@needs_cuda
@pytest.mark.cuda
def test_cuda_gate_up_silu_bf16() -> None:
    for m in (1, 16, 32, 200):
        _check(torch.bfloat16, "cuda", m, 2048, 8192, False, 1e-2)
    _check(torch.bfloat16, "cuda", 5, 896, 4864, True, 1e-2)
    for norm, pair, residual in [(True, False, False), (True, True, False),
                                 (False, False, True)]:
        for m in (1, 32, 200):
            _check_linear(torch.bfloat16, "cuda", m, 2048, 2048, False, norm, pair, residual,
                          1e-2)


@pytest.mark.skipif(IN_INTERPRETER, reason="the torch path, not the interpreter")
@pytest.mark.parametrize(("family", "fused_kinds"),
                         [("llama", "all"), ("mistral", "all"), ("qwen2", "all"),
                          ("qwen3", "all"), ("llama", "norm_pair"), ("qwen2", "norm")])
def test_six_kernel_layer_torch_path_greedy_equals_generate(family, fused_kinds, tmp_path,
                                                             monkeypatch):
    """The six-kernel layer's restructured residual stream (the hidden state carried whole,
    residual adds in the o/down epilogues, norms in the next GEMM's prologue) through the
    engine on CPU (torch twins): greedy tokens equal generate's, preemption forced. With
    fused_kinds other than "all", mode "auto" with a stand-in table that picks the fused kernel
    only for those kinds and cuBLAS + separate ops elsewhere: the residual add a cuBLAS o or
    down leaves pending is done by the next norm (add_rms_norm, or the fused kernel's add
    prologue, which `fused_add_norm_linear` must then run)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    sys.path.insert(0, str(REPO_ROOT / "tests" / "engine"))
    from helpers import cpu_engine_outputs, hf_greedy, mixed_prompts
    from tiny_models import save_tiny_model

    from engine.model import fused_gemm, gemm_table, llama

    mode = "six"
    if fused_kinds != "all":
        mode, kinds = "auto", fused_kinds.split(",")
        cfg16 = gemm_table.GemmConfig(16, 64, 4, 3)
        monkeypatch.setattr(gemm_table, "choose",
                            lambda mode, kind, *a: cfg16 if kind in kinds else None)
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
    tokens, stats = cpu_engine_outputs(model_dir, prompts, 12, fused_layer=mode)
    assert calls, "the six-kernel layer did not run"
    assert bool(add_calls) == (fused_kinds != "all"), "the pending add took the wrong path"
    assert stats["preemptions"] > 0
    assert tokens == expected


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize(("mode", "pdl"), [("epilogues", False), ("six", False), ("six", True),
                                           ("auto", True)])
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_greedy_with_epilogue_equals_generate(graphs, mode, pdl, tiny_model_dir):
    sys.path.insert(0, str(REPO_ROOT / "tests" / "engine"))
    from helpers import cuda_engine_outputs, hf_greedy, mixed_prompts

    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(9, seed=5)
    expected = hf_greedy(model_dir, prompts, 12, "cuda", torch.bfloat16)
    got, _, settings = cuda_engine_outputs(model_dir, prompts, 12, async_batching=False,
                                           cuda_graphs=graphs, model_impl="gapless",
                                           fused_layer=mode, fused_pdl=pdl)
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
def test_gemm_table_choice(tmp_path, monkeypatch) -> None:
    """`auto` takes the fused kernel only where the table measured it faster on this GPU (its
    PDL time with PDL on); cuBLAS on another GPU, an unmeasured shape or M above the buckets;
    `six` always the fused kernel, with the heuristic where unmeasured."""
    import json

    from engine.model import gemm_table as gt

    entries = {"norm:960x576:m16": dict(config=[16, 256, 4, 3], triton_us=3.0, pdl_us=2.0,
                                         cublas_us=5.0),
               "residual:576x576:m16": dict(config=[32, 128, 4, 4], triton_us=4.0,
                                            pdl_us=2.5, cublas_us=3.0)}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "GPU X", "entries": entries}))
    monkeypatch.setenv("GAPLESS_FUSED_TABLE", str(path))
    gt.load_table.cache_clear()
    try:
        assert gt.choose("auto", "norm", 960, 576, 9, "GPU X") == gt.GemmConfig(16, 256, 4, 3)
        assert gt.choose("auto", "residual", 576, 576, 16, "GPU X") is None
        assert gt.choose("auto", "residual", 576, 576, 16, "GPU X", pdl=True) == (32, 128, 4, 4)
        assert gt.choose("auto", "norm", 960, 576, 16, "GPU Y") is None
        assert gt.choose("auto", "norm", 960, 576, 33, "GPU X") is None
        assert gt.choose("auto", "norm_pair", 1536, 576, 16, "GPU X") is None
        assert gt.choose("plain", "norm", 960, 576, 16, "GPU X") is None
        assert gt.choose("six", "norm", 960, 576, 1, None) == gt.heuristic_config(960, 576)
        assert gt.choose("six", "residual", 576, 576, 16, "GPU X") == (32, 128, 4, 4)
        assert gt.heuristic_config(576, 576).block_n == 16  # 36 programs, not 9
    finally:
        gt.load_table.cache_clear()
