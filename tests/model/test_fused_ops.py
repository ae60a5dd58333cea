"""The fused ops' Triton kernels against their torch twins (Triton interpreter on CPU, real
kernels on CUDA), and a whole fused-model forward with Triton ops and Triton attention
against the torch path.

``test_interp_*`` run only in the TRITON_INTERPRET=1 child that the (slow) parent test
starts, as in tests/attention/test_paged_attention.py (Triton reads the variable at import);
fp32 and fp16 only: the interpreter mishandles bf16. ``test_cuda_*`` run on a GPU in bf16.
Outputs are poisoned with NaN first, so an element a kernel forgets to write fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from interpreter_child import run_interpreter_child  # tests/ is on sys.path (conftest.py)
from sm90 import NO_PTXAS, compile_sm90, ptxas_available, signature

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

interp_only = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 child")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or IN_INTERPRETER,
                                reason="needs a CUDA GPU (and a real Triton)")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    assert not torch.isnan(a).any(), "NaN in the kernel's output (an element was not written)"
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_fused_kernels_match_torch_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


def flat_batch(family: str, **config_extra):
    """The tiny fused model of `family` (tests/tiny_models.py, ``config_extra`` on its config)
    and ``run(backend=None)``: one mixed flat batch through it (request 0: 5 prompt tokens,
    prefill; request 1: one decode at position 9; one padding token), on fresh random K/V
    caches, the reference attention unless ``backend``; returns (logits of tokens 4 and 5,
    the caches). Returns (hf model, fused model, run)."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from tiny_models import make_config
    from transformers import AutoModelForCausalLM

    from engine.attention.interface import AttnContext
    from engine.attention.reference import paged_attention as ref_attention
    from engine.model.weights import build_fused_model

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make_config(family, **config_extra)).eval()
    model = build_fused_model(hf)
    c = hf.config
    kvh = c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    pos = torch.tensor([0, 1, 2, 3, 4, 9, 0], dtype=torch.int32)
    req = torch.tensor([0, 0, 0, 0, 0, 1, -1], dtype=torch.int32)
    bt = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    slots = torch.tensor([0, 1, 2, 3, 4, 4 * 4 + 9 - 8, 6 * 4], dtype=torch.int64)
    ids = torch.randint(1, 300, (1, 7))

    def run(backend=None):
        torch.manual_seed(1)
        kv = [(torch.randn(7, 4, kvh, d), torch.randn(7, 4, kvh, d))
              for _ in range(c.num_hidden_layers)]
        ctx = AttnContext(kv_caches=kv, slot_mapping=slots, block_tables=bt, token_req=req,
                          token_pos=pos, backend=backend or ref_attention)
        with torch.inference_mode():
            logits = model(input_ids=ids, position_ids=pos[None],
                           logits_to_keep=torch.tensor([4, 5]), gapless=ctx).logits
        return logits, kv

    return hf, model, run


def _check_add_rms_norm(dtype: torch.dtype, device: str, t: int, n: int, residual: bool) -> None:
    from engine.model import fused_ops as ops

    g = torch.Generator().manual_seed(n + t)
    x = torch.randn(t, n, generator=g).to(device, dtype)
    r = torch.randn(t, n, generator=g).to(device, dtype) if residual else None
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(device, dtype)
    ref_out, ref_res = ops.add_rms_norm_torch(x, r, w, 1e-5)
    out, res = ops.add_rms_norm_triton(x, None if r is None else r.clone(), w, 1e-5)
    assert rel_err(out, ref_out) < TOL[dtype]
    assert rel_err(res, ref_res) < TOL[dtype]


def _rope_case(dtype: torch.dtype, device: str, heads: int, kvh: int, d: int, norm: bool):
    t, block_size, num_blocks, max_pos = 7, 4, 6, 64
    g = torch.Generator().manual_seed(d + heads)
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=g).to(device, dtype)
    ang = torch.rand(max_pos, d // 2, generator=g) * 6.28
    cos_sin = torch.stack((ang.cos(), ang.sin()), dim=1).to(device, dtype).contiguous()
    positions = torch.tensor([0, 5, 63, 2, 9, 9, 30], dtype=torch.int32, device=device)
    slots = torch.tensor([3, 17, 0, 23, 8, 12, 5], dtype=torch.int64, device=device)
    qk_norm = (1 + 0.1 * torch.randn(2, d, generator=g)).to(device, dtype) if norm else None
    shape = (num_blocks, block_size, kvh, d)
    caches = [torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(4)]
    return qkv, cos_sin, positions, slots, caches, qk_norm


def _check_rope(dtype: torch.dtype, device: str, heads: int, kvh: int, d: int,
                norm: bool) -> None:
    from engine.model import fused_ops as ops

    qkv, cs, pos, slots, (k0, v0, k1, v1), qk_norm = _rope_case(dtype, device, heads, kvh, d,
                                                               norm)
    q_ref = ops.rope_and_cache_torch(qkv, cs, pos, slots, k0, v0, heads, qk_norm, 1e-6)
    q = ops.rope_and_cache_triton(qkv, cs, pos, slots, k1, v1, heads, qk_norm, 1e-6)
    assert rel_err(q, q_ref) < TOL[dtype]
    written = torch.zeros(k0.shape[0] * k0.shape[1], dtype=torch.bool)
    written[slots.cpu()] = True
    for mine, ref in ((k1, k0), (v1, v0)):
        flat_m, flat_r = mine.view(-1, *mine.shape[2:]), ref.view(-1, *ref.shape[2:])
        assert rel_err(flat_m[written.to(device)], flat_r[written.to(device)]) < TOL[dtype]
        assert torch.isnan(flat_m[~written.to(device)]).all(), "wrote outside slot_mapping"


def _check_silu(dtype: torch.dtype, device: str, t: int, n: int) -> None:
    from engine.model import fused_ops as ops

    g = torch.Generator().manual_seed(n)
    gu = (3 * torch.randn(t, 2 * n, generator=g)).to(device, dtype)
    assert rel_err(ops.silu_and_mul_triton(gu), ops.silu_and_mul_torch(gu)) < TOL[dtype]


DTYPES = [torch.float32, torch.float16]


@interp_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 100])
@pytest.mark.parametrize("residual", [False, True])
def test_interp_add_rms_norm(dtype, n, residual) -> None:
    _check_add_rms_norm(dtype, "cpu", 5, n, residual)


@interp_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kvh", "d"), [(4, 2, 16), (8, 2, 32), (3, 1, 80)])
@pytest.mark.parametrize("norm", [False, True])
def test_interp_rope_and_cache(dtype, heads, kvh, d, norm) -> None:
    _check_rope(dtype, "cpu", heads, kvh, d, norm)


@interp_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [128, 1500])
def test_interp_silu_and_mul(dtype, n) -> None:
    _check_silu(dtype, "cpu", 3, n)


@interp_only
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_interp_fused_model_forward_matches_torch_path(family, tmp_path, monkeypatch) -> None:
    """One mixed prefill+decode flat batch through the fused model: Triton ops and Triton
    attention (interpreted) vs the torch ops and the torch reference attention."""
    from engine.attention.triton_paged import paged_attention as triton_attention
    from engine.model import fused_ops

    hf, model, run = flat_batch(family)

    got, _ = run(triton_attention)
    monkeypatch.setattr(fused_ops, "use_triton", lambda x: False)
    want, _ = run()
    assert got.shape == want.shape == (1, 2, hf.config.vocab_size)
    assert rel_err(got, want) < 1e-4


@needs_cuda
@pytest.mark.cuda
def test_cuda_kernels_match_torch_in_bf16() -> None:
    for residual in (False, True):
        _check_add_rms_norm(torch.bfloat16, "cuda", 33, 4096, residual)
    for norm in (False, True):
        _check_rope(torch.bfloat16, "cuda", 32, 8, 128, norm)
    _check_silu(torch.bfloat16, "cuda", 32, 14336)


SM90_CASES = [
    # kernel, dtype, constexprs
    ("_add_rms_norm_kernel", "bf16", dict(HAS_RESIDUAL=True, BLOCK=4096), 16),
    ("_add_rms_norm_kernel", "bf16", dict(HAS_RESIDUAL=False, BLOCK=2048), 8),
    ("_rope_and_cache_kernel", "bf16", dict(H=32, KVH=8, HALF=64, HALF_PAD=64, BLOCK_SIZE=16,
                                            HAS_NORM=False), 1),
    ("_rope_and_cache_kernel", "bf16", dict(H=16, KVH=8, HALF=64, HALF_PAD=64, BLOCK_SIZE=16,
                                            HAS_NORM=True), 1),
    ("_rope_and_cache_kernel", "fp16", dict(H=9, KVH=3, HALF=32, HALF_PAD=32, BLOCK_SIZE=16,
                                            HAS_NORM=False), 1),
    ("_silu_and_mul_kernel", "bf16", dict(BLOCK=1024), 4),
]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or IN_INTERPRETER,
                    reason="on a GPU the cuda tests compile and run the kernels for real")
@pytest.mark.skipif(not ptxas_available(), reason=NO_PTXAS)
@pytest.mark.parametrize("case", SM90_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3]}")
def test_kernels_compile_for_sm90_without_a_gpu(case: tuple) -> None:
    """Real compilation (not the interpreter) for an H100/H200 target catches what the
    interpreter lets through: constexpr misuse, pointer arithmetic types, casts."""
    from engine.model import fused_ops

    name, dt, const, warps = case
    kernel = getattr(fused_ops, name)
    sig = signature(kernel, const, lambda n: (
        {"pos_ptr": "*i32", "slot_ptr": "*i64"}.get(n, f"*{dt}") if n.endswith("_ptr")
        else "fp32" if n == "eps" else "i32"))  # N and the strides
    ptrs = [n for n in kernel.arg_names if n.endswith("_ptr")]
    compiled = compile_sm90(kernel, const, sig, ptrs, num_warps=warps)
    assert compiled.asm["ptx"]
