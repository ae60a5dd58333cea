"""The Triton paged attention kernel against the torch reference (Triton interpreter on
CPU, real kernel on CUDA), and CUDA-graph replay. The reference itself is checked against
dense attention in test_paged_attention_ref.py; batch builders live in paged_batches.py.

How the groups run:

- ``test_interp_*``: the Triton kernel under ``TRITON_INTERPRET=1``. Triton reads that
  variable when a kernel is defined (module import), so it must be set before
  ``engine.attention.triton_paged`` is imported and must not leak into other test modules. The
  parent-process test ``test_triton_kernel_matches_reference_in_interpreter_subprocess``
  (marked slow) therefore re-runs this file in a child ``python -m pytest -k test_interp_``
  with the variable set; outside such a child the ``test_interp_*`` tests skip. To run
  only the child directly: ``TRITON_INTERPRET=1 .venv/bin/python -m pytest
  tests/attention/test_paged_attention.py -k test_interp_``. fp32 and fp16 only: the
  interpreter mishandles bf16.
- ``test_kernel_compiles_for_sm90_without_a_gpu`` (slow, CPU-only machines with a ptxas):
  builds the real kernel for an sm_90 target, so compile errors show up without a GPU.
- ``test_cuda_*`` (marked cuda, skipped without a GPU or inside the interpreter child):
  realistic shapes (H=32, KVH=8, D=128, block 16, contexts up to 8448) in bf16/fp16, and
  a capture/replay in a torch.cuda.CUDAGraph after changing the inputs' values in place.

Every run writes into an output buffer poisoned with NaN, so an element the kernel forgets
to write fails the test. Errors are relative: ||out - ref|| / ||ref||.
"""

from __future__ import annotations

import pytest
import torch
from interpreter_child import run_interpreter_child  # tests/ is on sys.path (conftest.py)
from paged_batches import (
    IN_INTERPRETER,
    MIXED,
    TOL,
    assert_padding_zero,
    make_batch,
    rel_err,
    run_ref,
    run_triton,
)
from sm90 import NO_PTXAS, compile_sm90, ptxas_available, signature

from engine.attention.reference import paged_attention as ref_attention

interp_only = pytest.mark.skipif(
    not IN_INTERPRETER,
    reason="runs in the TRITON_INTERPRET=1 child started by the subprocess test",
)
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available() or IN_INTERPRETER,
    reason="needs a CUDA GPU (and a real, non-interpreted Triton)",
)


def test_triton_rejects_non_power_of_two_head_dim() -> None:
    from engine.attention.triton_paged import paged_attention

    b = make_batch([(1, 4)], heads=4, kv_heads=2, head_dim=48, block_size=16, dtype=torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        paged_attention(b.q, b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, 1.0)


# ------------------------------------------------------------------- (b) Triton interpreter


@pytest.mark.slow
@pytest.mark.skipif(IN_INTERPRETER, reason="this is the parent of the interpreter run")
def test_triton_kernel_matches_reference_in_interpreter_subprocess() -> None:
    proc, report = run_interpreter_child(__file__)
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report


INTERP_CASES = [
    # dtype, heads, kv_heads, head_dim, block_size, sliding_window, num_splits
    (torch.float32, 8, 2, 32, 16, None, 1),
    (torch.float32, 8, 2, 32, 16, None, 3),
    (torch.float32, 8, 2, 32, 32, 7, 1),
    (torch.float32, 8, 2, 32, 16, 7, 2),
    (torch.float32, 2, 2, 16, 16, None, 1),  # MHA: 16 query tokens per tile
    (torch.float32, 6, 2, 16, 16, None, 2),  # group of 3, padded to 4
    (torch.float32, 32, 1, 16, 32, None, 1),  # group of 32: one token per tile, 32 rows
    (torch.float16, 8, 2, 64, 16, None, 1),
    (torch.float16, 8, 2, 64, 16, 9, 4),
    (torch.float16, 4, 1, 128, 32, None, 2),
]


@interp_only
@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_interp_triton_matches_reference(case: tuple) -> None:
    dtype, heads, kv_heads, head_dim, block_size, window, splits = case
    b = make_batch(
        MIXED, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, padding=3, seed=heads + head_dim + splits,
    )
    ref = run_ref(b, window)
    # 16-key tiles, one tile per split at least: the short contexts really split.
    out = run_triton(b, window, splits, block_n=16, min_tiles=1)
    assert rel_err(out, ref) < TOL[dtype]
    assert_padding_zero(b, out)


@interp_only
def test_interp_interleaved_tokens_and_long_context() -> None:
    """Requests' tokens not contiguous in the batch; one context spans many key tiles."""
    b = make_batch(
        [(1, 300), (4, 130), (1, 2), (2, 65)], heads=4, kv_heads=2, head_dim=16,
        block_size=16, dtype=torch.float32, padding=1, shuffle_tokens=True, seed=11,
    )
    for splits, ahead in ((1, False), (3, False), (1, True), (3, True)):
        out = run_triton(b, None, splits, block_n=32, min_tiles=1, table_ahead=ahead)
        assert rel_err(out, run_ref(b)) < TOL[torch.float32], f"{splits=} {ahead=}"


@interp_only
@pytest.mark.parametrize("block_size,block_n", [(32, 16), (16, 128), (16, 16)])
def test_interp_key_tile_smaller_or_larger_than_cache_block(block_size: int, block_n: int) -> None:
    b = make_batch(
        MIXED, heads=4, kv_heads=2, head_dim=16, block_size=block_size, dtype=torch.float32,
        padding=2, seed=block_n,
    )
    for window, ahead in ((None, False), (12, False), (None, True), (12, True)):
        out = run_triton(b, window, num_splits=2, block_n=block_n, min_tiles=1,
                         table_ahead=ahead)
        assert rel_err(out, run_ref(b, window)) < TOL[torch.float32], f"{window=} {ahead=}"


@interp_only
def test_interp_strided_query_and_output() -> None:
    """q and out as views with non-unit strides (e.g. slices of a fused qkv projection)."""
    from engine.attention.triton_paged import paged_attention

    b = make_batch(MIXED, heads=4, kv_heads=2, head_dim=32, block_size=16, dtype=torch.float16)
    qkv = torch.randn((b.q.shape[0], 8, 32)).half()
    q = qkv[:, 2:6]
    big_out = torch.full((4, b.q.shape[0], 32), float("nan")).half()
    out = big_out.transpose(0, 1)  # [T, H, D] with a non-contiguous layout
    paged_attention(
        q, b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, b.scale, out=out
    )
    ref = ref_attention(
        q.contiguous(), b.k_cache, b.v_cache, b.block_tables, b.token_req, b.token_pos, b.scale
    )
    assert rel_err(out, ref) < TOL[torch.float16]


@interp_only
def test_interp_all_padding() -> None:
    b = make_batch([(1, 3)], heads=4, kv_heads=2, head_dim=16, block_size=16, dtype=torch.float32)
    b.token_req.fill_(-1)
    for splits in (1, 2):
        out = run_triton(b, None, splits, block_n=16, min_tiles=1)
        assert torch.equal(out, torch.zeros_like(out))


@interp_only
@pytest.mark.parametrize("splits,min_tiles", [(8, 1), (4, 2), (2, 3), (16, 1)])
def test_interp_splits_beyond_the_context_and_counters_reset(splits: int, min_tiles: int) -> None:
    """More splits than a context has tiles (or than min_tiles allows): the unused ones exit,
    the split that arrives last still merges, and every counter is back at 0 afterwards, so a
    second launch (a graph replay) gives the same result."""
    from engine.attention import triton_paged

    b = make_batch(
        [(1, 70), (1, 3), (2, 40), (1, 129)], heads=8, kv_heads=2, head_dim=16,
        block_size=16, dtype=torch.float32, padding=1, seed=splits,
    )
    ref = run_ref(b)
    first = run_triton(b, None, splits, block_n=16, min_tiles=min_tiles)
    assert rel_err(first, ref) < TOL[torch.float32]
    assert_padding_zero(b, first)
    for buf in triton_paged._SEMAPHORES.values():
        assert int(buf.abs().sum()) == 0, "a split counter was left non-zero"
    second = run_triton(b, None, splits, block_n=16, min_tiles=min_tiles)
    assert torch.equal(first, second)


def test_default_config_splits_only_small_batches_and_checks_overrides() -> None:
    """Shapes alone pick the launch: a decode batch that fills the GPU runs one split, a
    small one splits; a split takes at least MIN_KEYS_PER_SPLIT keys; bad overrides fail."""
    from engine.attention.triton_config import MIN_KEYS_PER_SPLIT, default_num_splits
    from engine.attention.triton_paged import resolve_config

    assert default_num_splits(32 * 8, 132) == 1
    assert default_num_splits(16 * 3, 132) == 4
    assert default_num_splits(1 * 8, 132) == 16
    cfg = resolve_config(tokens=4, kv_heads=2, group=4, head_dim=128, elem_size=2,
                         device=torch.device("cpu"))
    assert cfg.min_tiles * cfg.block_n >= MIN_KEYS_PER_SPLIT
    # A decode-sized batch at one split streams 64-key tiles two at a time; a prefill-sized
    # one keeps 128-key tiles, one at a time.
    decode = resolve_config(tokens=32, kv_heads=8, group=4, head_dim=128, elem_size=2,
                            device=torch.device("cpu"))
    assert (decode.num_splits, decode.block_n, decode.table_ahead) == (1, 64, True)
    prefill = resolve_config(tokens=2048, kv_heads=8, group=4, head_dim=128, elem_size=2,
                             device=torch.device("cpu"))
    assert (prefill.block_n, prefill.table_ahead) == (128, False)
    for bad, match in (({"num_splits": 0}, "num_splits"), ({"min_tiles": 0}, "min_tiles"),
                       ({"block_n": 48}, "power of two")):
        with pytest.raises(ValueError, match=match):
            resolve_config(tokens=4, kv_heads=2, group=4, head_dim=128, elem_size=2,
                           device=torch.device("cpu"), **bad)


def test_pdl_is_never_used_without_a_gpu_that_has_it() -> None:
    from engine.attention.triton_config import pdl_available

    assert not pdl_available(torch.device("cpu"))


# ------------------------------------------------- compile for the GPU, on a machine without


SM90_CASES = [
    # dtype, group, head_dim, block_size, pdl, has_window, block_n, table_ahead
    ("bf16", 4, 128, 16, False, False, 64, False),
    ("bf16", 4, 128, 16, True, True, 64, True),
    ("fp16", 4, 128, 32, False, False, 128, True),
    ("bf16", 1, 64, 16, False, True, 64, False),
    ("bf16", 32, 256, 16, True, False, 32, False),
    ("fp32", 3, 64, 16, False, False, 64, True),
]


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available() or IN_INTERPRETER,
    reason="on a GPU the test_cuda_* tests compile and run the kernel for real",
)
@pytest.mark.skipif(not ptxas_available(), reason=NO_PTXAS)
@pytest.mark.parametrize("case", SM90_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_compiles_for_sm90_without_a_gpu(case: tuple) -> None:
    """Catch compile errors (and shared-memory blow-ups) on a CPU-only machine: build the
    kernel for an H100/H200 target with the specialisations the JIT would apply (unit
    strides on the head dimension, 16-divisible pointers and row strides)."""
    from engine.attention.triton_paged import _paged_attention_kernel as kernel
    from engine.attention.triton_paged import _tile_shape

    dt, group, head_dim, block_size, pdl, window, block_n, ahead = case
    g_pad, block_q = _tile_shape(group, block_n)
    const = dict(
        H=8 * group, G=group, G_PAD=g_pad, BLOCK_Q=block_q, D=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, HAS_WINDOW=window,
        IEEE_DOT=dt == "fp32", USE_PDL=pdl, TABLE_AHEAD=ahead, SPLIT=pdl,
        stride_qd=1, stride_kd=1, stride_vd=1, stride_od=1, stride_btb=1,
    )
    ptrs = {
        "q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "out_ptr": f"*{dt}",
        "bt_ptr": "*i32", "req_ptr": "*i32", "pos_ptr": "*i32",
        "part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "sem_ptr": "*i32",
    }
    types = {**ptrs, "scale_log2": "fp32"}
    sig = signature(kernel, const, lambda n: types.get(n, "i32"))
    aligned = [*ptrs, *(n for n in kernel.arg_names if n.startswith("stride") and n not in const)]
    compiled = compile_sm90(kernel, const, sig, aligned,
                            num_warps=4 if block_n <= 64 else 8, num_stages=3)
    assert compiled.metadata.shared <= 227 * 1024, "exceeds an H100/H200 block's shared memory"
    ptx = compiled.asm["ptx"]
    assert "cp.async" in ptx, "K/V tile loads are no longer software-pipelined"
    if ahead:  # K and V tiles multi-buffered: more than one tile of each in shared memory
        tile_bytes = block_n * head_dim * {"bf16": 2, "fp16": 2, "fp32": 4}[dt]
        assert compiled.metadata.shared >= 4 * tile_bytes, "K/V are no longer multi-buffered"
    assert ("griddepcontrol.wait" in ptx) == pdl
    if pdl:  # the cases that compile the split merge (SPLIT=pdl above, to cover both)
        assert "atom.global" in ptx or "atom.acq_rel" in ptx, "the split counter is not atomic"


# ------------------------------------------------------------------------------- (c) CUDA

CUDA_MIXED = [
    (1, 1), (1, 17), (1, 1280), (1, 4097), (1, 8448), (1, 8448), (256, 8448), (300, 300),
    (64, 1000), (1, 2048),
]


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_cuda_mixed_batch_matches_reference(dtype: torch.dtype, num_splits: int | None) -> None:
    b = make_batch(
        CUDA_MIXED, heads=32, kv_heads=8, head_dim=128, block_size=16, dtype=dtype,
        device="cuda", padding=5, seed=21,
    )
    ref = run_ref(b)
    for ahead in (False, True):
        out = run_triton(b, None, num_splits, min_tiles=1 if num_splits else None,
                         table_ahead=ahead)
        assert rel_err(out, ref) < TOL[dtype], f"table_ahead={ahead}"
        assert_padding_zero(b, out)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_decode_batch32_long_contexts(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    ctxs = torch.randint(1, 8448 + 1, (30,), generator=gen).tolist() + [8448, 8448 + 256]
    b = make_batch(
        [(1, c) for c in ctxs], heads=32, kv_heads=8, head_dim=128, block_size=16, dtype=dtype,
        device="cuda", seed=6,
    )
    ref = run_ref(b)
    for splits, min_tiles, pdl, ahead in ((None, None, False, False), (1, None, True, True),
                                          (2, 1, False, True), (8, 1, True, False),
                                          (16, None, False, True)):
        out = run_triton(b, None, splits, min_tiles=min_tiles, pdl=pdl, table_ahead=ahead)
        assert rel_err(out, ref) < TOL[dtype], f"{splits=} {min_tiles=} {pdl=} {ahead=}"


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("sliding_window", [None, 1000])
def test_cuda_shapes_and_window(head_dim: int, block_size: int, sliding_window: int | None) -> None:
    b = make_batch(
        [(1, 3000), (1, 999), (128, 1500), (7, 7)], heads=16, kv_heads=4, head_dim=head_dim,
        block_size=block_size, dtype=torch.bfloat16, device="cuda", padding=2, seed=head_dim,
    )
    ref = run_ref(b, sliding_window)
    for splits in (None, 4):
        out = run_triton(b, sliding_window, splits, min_tiles=1 if splits else None)
        assert rel_err(out, ref) < TOL[torch.bfloat16]
        assert_padding_zero(b, out)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("n_tokens,num_splits", [(32, None), (32, 4), (300, None)])
def test_cuda_graph_replay_after_in_place_input_changes(
    n_tokens: int, num_splits: int | None, pdl: bool
) -> None:
    """Capture once, then change token_pos, token_req, block_tables and q in place: replay
    must follow the new values (nothing value-dependent was baked in at capture), split-K
    counters included; with PDL each of two back-to-back launches waits for the other."""
    from engine.attention import triton_paged
    from engine.attention.triton_paged import paged_attention

    heads, kv_heads, d, bs, reqs, max_blocks = 32, 8, 128, 16, 32, 545  # up to 8720 keys
    dev, dtype = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(7)
    n_blocks = reqs * max_blocks
    k_cache = torch.randn((n_blocks, bs, kv_heads, d), device=dev, dtype=dtype, generator=gen)
    v_cache = torch.randn((n_blocks, bs, kv_heads, d), device=dev, dtype=dtype, generator=gen)
    q = torch.empty((n_tokens, heads, d), device=dev, dtype=dtype)
    block_tables = torch.empty((reqs, max_blocks), device=dev, dtype=torch.int32)
    token_req = torch.empty((n_tokens,), device=dev, dtype=torch.int32)
    token_pos = torch.empty((n_tokens,), device=dev, dtype=torch.int32)
    out = torch.empty_like(q)

    def fill(seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=g).to(dtype))
        block_tables.copy_(torch.randperm(n_blocks, generator=g)[: reqs * max_blocks].view(
            reqs, max_blocks).int())
        if n_tokens == reqs:  # one decode per request, random contexts
            req = torch.arange(reqs)
            pos = torch.randint(0, max_blocks * bs, (reqs,), generator=g)
        else:  # decodes for all but the last request, which runs a prefill chunk
            n_chunk = n_tokens - (reqs - 1)
            start = int(torch.randint(0, max_blocks * bs - n_chunk, (1,), generator=g))
            req = torch.cat([torch.arange(reqs - 1), torch.full((n_chunk,), reqs - 1)])
            pos = torch.cat([
                torch.randint(0, max_blocks * bs, (reqs - 1,), generator=g),
                torch.arange(start, start + n_chunk),
            ])
        pad = torch.rand(n_tokens, generator=g) < 0.1  # some padding tokens
        token_req.copy_(torch.where(pad, -1, req).int())
        token_pos.copy_(torch.where(pad, 0, pos).int())

    out2 = torch.empty_like(q)

    def attention() -> None:
        kw = dict(num_splits=num_splits, min_tiles=1 if num_splits else None, pdl=pdl)
        paged_attention(
            q, k_cache, v_cache, block_tables, token_req, token_pos, d**-0.5, out=out, **kw
        )
        # The second launch reads what the first wrote: a PDL launch must wait for it.
        paged_attention(
            out, k_cache, v_cache, block_tables, token_req, token_pos, d**-0.5, out=out2, **kw
        )

    fill(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        attention()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention()

    for seed in (1, 2, 3):
        fill(seed)
        out.fill_(float("nan"))
        out2.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = ref_attention(
            q, k_cache, v_cache, block_tables, token_req, token_pos, d**-0.5
        )
        assert rel_err(out, ref) < TOL[dtype], f"replay with inputs #{seed}"
        ref2 = ref_attention(
            out, k_cache, v_cache, block_tables, token_req, token_pos, d**-0.5
        )
        assert rel_err(out2, ref2) < TOL[dtype], f"second launch, inputs #{seed}"
        pad = token_req == -1
        assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    for buf in triton_paged._SEMAPHORES.values():
        assert int(buf.abs().sum()) == 0, "a split counter was left non-zero"

