"""A kernel's family and colour: one classifier, so the kernel lane, the Step anatomy page, a
recording and `python -m bench anatomy` name a kernel alike, and one colour per family."""

from __future__ import annotations

import pytest

from bench.harness.trace import analyse
from telemetry.anatomy import group_by_step
from telemetry.kernel_family import FAMILIES, FAMILY_COLOURS, colour_of, family_of
from telemetry.kernels import sample_from_dict

MARKER = ("void at::native::vectorized_elementwise_kernel<4, at::native::bitwise_not_kernel_cuda"
          "(at::TensorIteratorBase&)::{lambda()#1}::operator()() const::{lambda()#2}")


@pytest.mark.parametrize(("name", "family"), [
    # GEMMs: cuBLAS, CUTLASS, nvjet, its split-K reduce, our fused linear kernels
    ("ampere_bf16_s16816gemm_bf16_128x64", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_TNT", "gemm"),
    ("void splitKreduce_kernel<32, 16, int, float>", "gemm"),
    ("_fused_linear_kernel", "gemm"),
    ("_fused_linear_rope_kernel", "gemm"),  # the qkv GEMM with the rope in its epilogue
    ("aten::addmm", "gemm"),
    # attention, its split-K reduce, and flash kernels whose names hold "splitkv"
    ("_paged_attention_kernel", "attention"),
    ("_reduce_splits_kernel", "attention"),
    ("flash_fwd_splitkv_kernel", "attention"),
    # norms, fused and unfused (mean, pow, rsqrt)
    ("_add_rms_norm_kernel", "norm"),
    ("rms_norm_kernel", "norm"),
    ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda", "norm"),
    # rotary: our rope + KV write, an unfused rope's cos and negation
    ("_rope_and_cache_kernel", "rotary"),
    ("apply_rotary_kernel", "rotary"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::neg_kernel_cuda", "rotary"),
    # elementwise
    ("_silu_and_mul_kernel", "elementwise"),
    ("at::native::reduce_kernel<512, 1>", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
     "elementwise"),
    # sampling
    ("void at::native::reduce_kernel<ArgMaxOps<float>>", "sampling"),
    ("at::native::sbtopk::gatherTopK", "sampling"),
    ("void at::native::(anonymous namespace)::multinomial", "sampling"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>", "sampling"),
    # copies
    ("Memset (Device)", "copies"),
    ("Memcpy HtoD (Pinned -> Device)", "copies"),
    ("void at::native::index_elementwise_kernel", "copies"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<float>", "copies"),
    # a name no rule knows stays visible as such
    ("my_custom_thing", "other"),
    # the graph start marker (the elementwise rule would take it)
    (MARKER, "marker"),
])
def test_kernel_names_fall_into_families(name: str, family: str) -> None:
    assert family_of(name) == family


def test_every_family_has_its_own_colour_and_an_unknown_one_reads_as_other() -> None:
    assert set(FAMILY_COLOURS) == set(FAMILIES)
    assert len(set(FAMILY_COLOURS.values())) == len(FAMILIES)
    assert colour_of("no such family") == FAMILY_COLOURS["other"]


NAMES = ("nvjet_tst_gemm", "_fused_linear_kernel", "_rope_and_cache_kernel",
         "_paged_attention_kernel", "_add_rms_norm_kernel", "_silu_and_mul_kernel",
         "mystery_kernel")


def test_the_anatomy_the_bench_table_and_a_recording_name_each_kernel_alike() -> None:
    """A rotary kernel is "rotary" on the Step anatomy page, in the kernel lane of a replayed
    recording and in the bench table alike."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "gapless.step 1", "ts": 0.0,
               "dur": 1000.0, "tid": 1}]
    events += [{"ph": "X", "cat": "kernel", "name": n, "ts": 10.0 * i, "dur": 5.0, "tid": 1}
               for i, n in enumerate(NAMES)]
    anatomy = {k.name: k.family for k in group_by_step(events)[0].kernels}
    bench = analyse([events[1:]])["families"]
    # A recording written under older rules (every kernel "elementwise") is told again.
    recorded = sample_from_dict({"steps": [{"step": 1, "kernels": [
        {"name": n, "family": "elementwise", "start_ns": i, "end_ns": i + 1}
        for i, n in enumerate(NAMES)]}], "window": [0, 10], "kernel_ns": 7})
    replayed = {k.name: k.family for k in recorded.steps[0].kernels}
    expected = {n: family_of(n) for n in NAMES}
    assert anatomy == replayed == expected
    assert anatomy["_rope_and_cache_kernel"] == "rotary"
    assert anatomy["_fused_linear_kernel"] == "gemm"
    assert {f: int(v["count"]) for f, v in bench.items()} == {
        "gemm": 2, "rotary": 1, "attention": 1, "norm": 1, "elementwise": 1, "other": 1}
