"""The profiler-trace analysis behind `python -m bench anatomy`, on a synthetic kernel timeline:
step split at each H2D copy, kernels by family, gaps inside a step, and the tables built from it."""

from __future__ import annotations

from bench.harness.trace import analyse, split_steps
from bench.suites.anatomy import family_table, summary_row


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
    row = summary_row(r, layers=2, floor_us=72.0, reference_us=None)
    assert row[:9] == ["gapless", 32, "6", "3.0", "143", "5", "144", "72", "2.00"]
    wider = summary_row(r, layers=2, floor_us=72.0, reference_us=48.0)
    assert wider[9:11] == ["48", "3.00"] and len(wider) == len(row) + 2
