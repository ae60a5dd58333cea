"""bench_anatomy's trace analysis on a synthetic kernel timeline: family names, step split at
each H2D copy, gaps inside a step."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_anatomy import analyse, family_of, split_steps  # noqa: E402


def test_kernel_names_fall_into_families():
    assert family_of("_paged_attention_kernel") == "attention"
    assert family_of("nvjet_tst_128x8_64x12_2x1_v_bz_TNT") == "gemm"
    assert family_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert family_of("_add_rms_norm_kernel") == "norm"
    assert family_of("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>"
                     ) == "norm"
    assert family_of("_rope_and_cache_kernel") == "rotary"
    assert family_of("_silu_and_mul_kernel") == "elementwise"
    assert family_of("void at::native::reduce_kernel<ArgMaxOps<float>>") == "sampling"
    assert family_of("void at::native::index_elementwise_kernel") == "copies"
    assert family_of("something_new") == "other"


def _k(name, ts, dur, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_steps_split_at_h2d_and_gaps_measured():
    events = []
    for step in range(2):
        t0 = step * 1000
        events += [_k("Memcpy HtoD (Pinned -> Device)", t0, 2, "gpu_memcpy"),
                   _k("nvjet_gemm", t0 + 10, 100), _k("_add_rms_norm_kernel", t0 + 115, 5),
                   _k("_paged_attention_kernel", t0 + 120, 30),
                   _k("Memcpy DtoH (Device -> Pinned)", t0 + 160, 2, "gpu_memcpy")]
    steps = split_steps(events)
    assert len(steps) == 2
    r = analyse(steps)
    assert r["families"]["gemm"] == {"count": 1, "us": 100}
    assert r["families"]["copies"]["count"] == 2
    assert r["span_us"] == 140 and r["kernel_busy_us"] == 135
