"""The profiler-trace analysis behind `python -m bench anatomy`, on a synthetic kernel timeline:
family names, step split at each H2D copy, gaps inside a step, and the tables built from it."""

from __future__ import annotations

from bench.harness.trace import analyse, family_of, split_steps
from bench.suites.anatomy import family_table, summary_row


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


def _two_steps():
    events = []
    for step in range(2):
        t0 = step * 1000
        events += [_k("Memcpy HtoD (Pinned -> Device)", t0, 2, "gpu_memcpy"),
                   _k("nvjet_gemm", t0 + 10, 100), _k("_add_rms_norm_kernel", t0 + 115, 5),
                   _k("_paged_attention_kernel", t0 + 120, 30),
                   _k("mystery_kernel", t0 + 150, 4),
                   _k("Memcpy DtoH (Device -> Pinned)", t0 + 160, 2, "gpu_memcpy")]
    return events


def test_steps_split_at_h2d_and_gaps_measured():
    steps = split_steps(_two_steps())
    assert len(steps) == 2
    r = analyse(steps)
    assert r["families"]["gemm"] == {"count": 1, "us": 100}
    assert r["families"]["copies"]["count"] == 2
    assert r["span_us"] == 144 and r["kernel_busy_us"] == 139
    assert r["other_kernels"] == [("mystery_kernel", 8)]


def test_anatomy_tables_from_a_trace():
    r = analyse(split_steps(_two_steps()))
    r.update(impl="gapless", batch=32, settings={"model_impl": "gapless"}, wall_ms_per_step=0.5)
    table = family_table(r, w_bytes=100_000_000, kv_bytes=1_000_000)
    assert "| gemm | 1 | 100 |" in table and "1000 |" in table  # 1e8 B in 100 us = 1000 GB/s
    assert "unclassified: mystery_kernel 4 us" in table
    row = summary_row(r, layers=2, floor_us=72.0, aware_us=None)
    assert row[:9] == ["gapless", 32, "6", "3.0", "143", "5", "144", "72", "2.00"]
    wider = summary_row(r, layers=2, floor_us=72.0, aware_us=48.0)
    assert wider[9:11] == ["48", "3.00"] and len(wider) == len(row) + 2
