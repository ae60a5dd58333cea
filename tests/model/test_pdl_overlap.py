"""How a PDL launch of the fused kernels overlaps its neighbours (config key pdl_overlap):
the bytes a kernel asks L2 for before its wait, the launch each setting gives, the config's
check, and (compiled for sm_90 on the CPU) where the trigger and the prefetches land in the
kernel. The timing is a GPU's to say (docs/benchmarks.md)."""

from __future__ import annotations

import os

import pytest
import torch
from sm90 import NO_PTXAS, compile_sm90, ptxas_available, signature

from engine.config import EngineConfig
from engine.model import fused_gemm
from engine.model import pdl_launch as launch_policy
from engine.model.llama import FusedPath
from engine.model.pdl_launch import PREFETCH_BUDGET, pdl_launch, prefetch_k

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"


def test_prefetch_k_takes_whole_small_weights_and_bounds_large_ones() -> None:
    assert prefetch_k(576, 576, 2) == 576  # SmolLM2 o: 0.66 MB, all of it
    assert prefetch_k(6144, 576, 2) == 576  # SmolLM2 gate_up: 7.1 MB <= 8 MB
    k = prefetch_k(16384, 2048, 2)  # Llama-3.2-1B gate_up: 67 MB
    assert k == 256 and 16384 * k * 2 <= PREFETCH_BUDGET
    assert prefetch_k(3072, 2048, 2) % 64 == 0  # whole 128-byte lines
    assert 3072 * prefetch_k(3072, 2048, 2) * 2 <= PREFETCH_BUDGET < 3072 * 2048 * 2
    assert prefetch_k(1 << 20, 4096, 2) == 0  # not one line a row fits: no prefetch
    assert prefetch_k(576, 576, 4) == 576


def test_pdl_launch_off_without_pdl_or_a_gpu(monkeypatch) -> None:
    x = torch.zeros(4, 8)
    assert pdl_launch(False, "prefetch", x, 8, 8, 2) == (0, 0, {})
    assert pdl_launch(True, "prefetch", x, 8, 8, 2) == (0, 0, {})  # a CPU tensor


@pytest.mark.parametrize(("overlap", "expected"), [("late", (1, 0)), ("early", (2, 0)),
                                                   ("prefetch", (2, 576))])
def test_pdl_launch_levels(monkeypatch, overlap, expected) -> None:
    class FakeCuda:
        is_cuda = True
        device = torch.device("cpu")

    monkeypatch.setattr(launch_policy, "pdl_available", lambda device: True)
    gdc, pf, extra = pdl_launch(True, overlap, FakeCuda(), 576, 576, 2)
    assert (gdc, pf) == expected and extra == {"launch_pdl": True}
    with pytest.raises(ValueError, match="pdl_overlap must be one of"):
        pdl_launch(True, "soon", FakeCuda(), 576, 576, 2)


def test_config_checks_pdl_overlap() -> None:
    EngineConfig(model="x", pdl_overlap="early").validate()
    with pytest.raises(ValueError, match="pdl_overlap must be one of 'late', 'early', 'prefetch'"):
        EngineConfig(model="x", pdl_overlap="soon").validate()


def test_fused_path_launch_keywords() -> None:
    assert FusedPath("fused").attention_launch == {}
    prefetch = FusedPath("fused", pdl=True, overlap="prefetch")
    assert prefetch.attention_launch == {"pdl": True, "kv_prefetch": True}
    early = FusedPath("fused", pdl=True, overlap="early")
    assert early.attention_launch == {"pdl": True, "kv_prefetch": False}
    late = FusedPath("auto", pdl=True, overlap="late")
    assert late.launch == {"pdl": True, "overlap": "late"}
    with pytest.raises(ValueError, match="decode_layer must be one of cublas, fused, auto"):
        FusedPath("five")


def test_reference_attention_takes_the_launch_keywords() -> None:
    """The model passes PDL keywords to whichever backend it has; the torch one ignores them
    and returns what it returns without them."""
    from engine.attention.reference import paged_attention

    torch.manual_seed(0)
    q = torch.randn(2, 4, 16)
    k = torch.randn(3, 16, 2, 16)
    v = torch.randn(3, 16, 2, 16)
    bt = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32)
    req = torch.tensor([0, 1], dtype=torch.int32)
    pos = torch.tensor([20, 5], dtype=torch.int32)
    plain = paged_attention(q, k, v, bt, req, pos, 0.25)
    with_kw = paged_attention(q, k, v, bt, req, pos, 0.25, pdl=True, kv_prefetch=True)
    assert torch.equal(plain, with_kw)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available() or IN_INTERPRETER,
                    reason="on a GPU the cuda tests compile and run the kernels for real")
@pytest.mark.parametrize(("use_gdc", "pf_k"), [(1, 0), (2, 0), (2, 576)])
def test_trigger_and_prefetch_placement_sm90(use_gdc, pf_k) -> None:
    """Compiled for sm_90: "late" triggers the next kernel after the K loop's MMAs, "early"
    before them (right after the wait); "prefetch" issues its L2 prefetches before the wait."""
    if not ptxas_available():
        pytest.skip(NO_PTXAS)
    kernel = fused_gemm._fused_linear_kernel
    const = dict(NORM=True, PAIR=True, RESIDUAL=False, ADD_IN=True, HAS_BIAS=False, BLOCK_M=16,
                 BLOCK_N=16, BLOCK_K=256, NORM_BK=512, USE_GDC=use_gdc, PF_K=pf_k)
    sig = signature(kernel, const, lambda n: "*bf16" if n.endswith("_ptr")
                    else "fp32" if n == "eps" else "i32")
    aligned = [n for n in kernel.arg_names if sig[n] not in ("constexpr", "fp32") and n != "M"]
    ptx = compile_sm90(kernel, const, sig, aligned, num_warps=2, num_stages=4).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    trigger = ptx.index("griddepcontrol.launch_dependents")
    first_mma = ptx.index("mma")
    assert wait < trigger
    assert (trigger < first_mma) == (use_gdc == 2)
    if pf_k:
        assert 0 <= ptx.index("prefetch.global.L2") < wait
    else:
        assert "prefetch.global.L2" not in ptx


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or IN_INTERPRETER,
                                reason="needs a CUDA GPU (and a real Triton)")


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("overlap", ["late", "early", "prefetch"])
def test_cuda_fused_kernels_equal_without_pdl_for_every_overlap(overlap) -> None:
    """A chain of fused kernels launched with PDL (gate_up -> down -> qkv + rope, replayed
    from a CUDA graph) writes bit for bit what the same chain without PDL writes."""
    from engine.model.fused_rope import fused_qkv_rope

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    m, hid, inter, heads, kvh, d = 16, 576, 1536, 9, 3, 64
    x = torch.randn(m, hid, device=dev, dtype=dt)
    norm = torch.rand(hid, device=dev, dtype=dt) + 0.5
    gate_up = torch.randn(2 * inter, hid, device=dev, dtype=dt) / hid ** 0.5
    down = torch.randn(hid, inter, device=dev, dtype=dt) / inter ** 0.5
    qkv = torch.randn((heads + 2 * kvh) * d, hid, device=dev, dtype=dt) / hid ** 0.5
    cos_sin = torch.randn(512, d, device=dev, dtype=dt)
    pos = torch.arange(m, device=dev, dtype=torch.int32) + 100
    slots = torch.arange(m, device=dev, dtype=torch.int64) + 7

    def chain(pdl: bool):
        k_cache = torch.zeros(8, 16, kvh, d, device=dev, dtype=dt)
        v_cache = torch.zeros_like(k_cache)

        def run():
            a = fused_gemm.fused_linear(x, gate_up, norm=norm, pair=True, pdl=pdl,
                                        overlap=overlap)
            y = fused_gemm.fused_linear(a, down, residual=x, pdl=pdl, overlap=overlap)
            q, _ = fused_qkv_rope(y, None, qkv, None, norm=norm, eps=1e-5, cos_sin=cos_sin,
                                  positions=pos, slot_mapping=slots, k_cache=k_cache,
                                  v_cache=v_cache, num_heads=heads, pdl=pdl, overlap=overlap)
            return y, q

        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = run()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        return out[0].clone(), out[1].clone(), k_cache.clone(), v_cache.clone()

    for got, want in zip(chain(True), chain(False), strict=True):
        assert torch.equal(got, want)


@pytest.mark.cuda
@needs_cuda
def test_cuda_attention_with_kv_prefetch_equals_plain_launch() -> None:
    """Paged attention launched with PDL and the K/V prefetch returns what the plain launch
    returns, for a decode batch and a longer context than the prefetch covers."""
    from engine.attention.triton_paged import paged_attention

    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    b, heads, kvh, d, bs = 16, 9, 3, 64, 16
    ctx = torch.tensor([264, 700, 17] + [300] * (b - 3), dtype=torch.int32)
    blocks = int(((ctx + bs - 1) // bs).sum())
    k = torch.randn(blocks + 1, bs, kvh, d, device=dev, dtype=dt)
    v = torch.randn_like(k)
    perm = torch.randperm(blocks, device=dev).to(torch.int32) + 1
    width = int(((ctx + bs - 1) // bs).max())
    bt = torch.zeros(b, width, dtype=torch.int32, device=dev)
    start = 0
    for i, c in enumerate(ctx.tolist()):
        n = (c + bs - 1) // bs
        bt[i, :n] = perm[start:start + n]
        start += n
    q = torch.randn(b, heads, d, device=dev, dtype=dt)
    req = torch.arange(b, dtype=torch.int32, device=dev)
    pos = (ctx - 1).to(dev)
    plain = paged_attention(q, k, v, bt, req, pos, d ** -0.5, pdl=False)
    pre = paged_attention(q, k, v, bt, req, pos, d ** -0.5, pdl=True, kv_prefetch=True)
    torch.cuda.synchronize()
    assert torch.equal(plain, pre)


def test_kv_prefetch_only_within_its_budget() -> None:
    """Shapes only: SmolLM2-135M b16 (3 MB) and Llama-3.2-1B b1 prefetch; the batch-32 shapes
    of 1B (17 MB) and 8B (34 MB), where a prefetch costs more than it saves, do not."""
    from engine.attention.l2_prefetch import kv_prefetch_fits

    assert kv_prefetch_fits(16, 3, 64, 2)
    assert kv_prefetch_fits(1, 8, 64, 2)
    assert not kv_prefetch_fits(32, 8, 64, 2)
    assert not kv_prefetch_fits(32, 8, 128, 2)
