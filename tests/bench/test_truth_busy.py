"""The truth suite's fair busy (bench/harness/truth_busy.py) on a CPU: torch.profiler's kernels
put on our clock and joined to our steps' compute spans, the bare step period, and busy of
unperturbed steps from each tracer's kernel time per step."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest

from bench.harness import truth_busy as tb
from telemetry.kernels import KernelRecord, KernelSample, SampledStep


def rec(step, start_us, end_us):
    return SimpleNamespace(step=step, spans=[
        SimpleNamespace(lane="cpu.schedule", start_ns=0, end_ns=1),
        SimpleNamespace(lane="compute", start_ns=int(start_us * 1000),
                        end_ns=int(end_us * 1000))])


def test_kernels_join_the_step_whose_compute_span_holds_their_midpoint():
    # steps every 100 us, compute 10..70 us into each; kernels 20..30 and 40..60 us in
    records = [rec(n, 100 * n + 10, 100 * n + 70) for n in range(5)]
    spans = tb.compute_spans(records, 0, 10**9)
    assert [s[0] for s in spans] == [0, 1, 2, 3, 4]
    assert tb.period_us(spans) == pytest.approx(100.0)
    iv = sorted([(1000 * (100 * n + 20), 1000 * (100 * n + 30)) for n in range(5)]
                + [(1000 * (100 * n + 40), 1000 * (100 * n + 60)) for n in range(5)])
    out = tb.kernel_per_step(spans, iv)
    assert out["median_us"] == pytest.approx(30.0) and out["steps"] == 5
    assert out["joined"] == pytest.approx(1.0)
    # a kernel between two steps' spans joins neither, and says so
    iv.append((1000 * 185, 1000 * 195))
    out = tb.kernel_per_step(spans, sorted(iv))
    assert out["median_us"] == pytest.approx(30.0)
    assert out["joined"] == pytest.approx(150 / 160)
    # spans outside the window are left out; a gap in step numbers is not a period
    assert [s[0] for s in tb.compute_spans(records, 100_000, 360_000)] == [1, 2]
    assert tb.period_us([(1, 0, 5), (3, 300_000, 305_000)]) is None


def test_profiler_events_land_on_our_clock_without_host_copies_or_the_marker():
    trace = {"baseTimeNanoseconds": 1_000_000_000_000, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": 5.0, "dur": 2.5},
        {"ph": "X", "cat": "kernel", "name": "void bitwise_not_kernel", "ts": 1.0, "dur": 1.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "ts": 9.0,
         "dur": 1.0},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 12.0,
         "dur": 1.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 4.0, "dur": 1.0}]}
    host_copy = re.compile(r"Memcpy (HtoD|DtoH)")
    iv = tb.trace_intervals(trace, 999_000_000_000, ("kernel", "gpu_memcpy"), host_copy)
    # unix ns = base + ts * 1000; ours = unix - offset (1e9 ns here)
    assert iv == [(1_000_005_000, 1_000_007_500), (1_000_012_000, 1_000_013_000)]
    with_marker = tb.trace_intervals(trace, 999_000_000_000, ("kernel",), host_copy, marker=True)
    assert with_marker == [(1_000_001_000, 1_000_002_000), (1_000_005_000, 1_000_007_500)]


def test_busy_against_the_bare_period_from_each_tracer():
    out = tb.fair_busy(1000.0, 540.0, 535.0)
    assert out["ref_vs_bare"] == pytest.approx(0.54) and out["ours_vs_bare"] == pytest.approx(
        0.535)
    assert out["diff_vs_bare_pp"] == pytest.approx(-0.5)
    assert out["kernel_diff_pct"] == pytest.approx(100 * (535 / 540 - 1))
    assert tb.fair_busy(None, 540.0, 535.0)["diff_vs_bare_pp"] is None
    s = KernelSample([SampledStep(1, [KernelRecord("bitwise_not", "marker", 0, 2000),
                                      KernelRecord("gemm", "gemm", 3000, 8000),
                                      KernelRecord("attn", "attention", 7000, 10_000)])],
                     (0, 20_000), 9000)
    assert tb.sampled_kernel_per_step([s]) == pytest.approx(7.0)  # marker left out, union
    assert tb.spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}


def test_the_clock_offset_is_unix_time_less_the_perf_counter():
    off = tb.clock_offset_ns()
    assert abs(time.time_ns() - time.perf_counter_ns() - off) < 5_000_000


def crec(step, ctx, start_us, end_us):
    r = rec(step, start_us, end_us)
    r.chunks = [("req-0", 1, ctx)]
    return r


def test_both_tracers_are_compared_on_the_same_contexts():
    """Kernel time grows with context while the kernels stay the same. A reference over
    later steps and a sampler over earlier ones count the same kernels yet read apart in
    graph mode: compared on the contexts both traced, the same kernels give the same time."""
    kern = lambda ctx: 900_000 + 100 * ctx  # noqa: E731 (ns: 900 us + 0.1 us a token)
    ref_recs = [crec(n, 300 + n, 1000 * n, 1000 * n + 990) for n in range(400)]
    ours_recs = [crec(1000 + n, 100 + n, 0, 1) for n in range(0, 300, 10)]
    ref = {r.step: kern(r.chunks[0][2]) for r in ref_recs}
    ours = {r.step: kern(r.chunks[0][2]) for r in ours_recs}
    by_ref = tb.by_context(ref_recs + ours_recs, ref)
    by_ours = tb.by_context(ref_recs + ours_recs, ours)
    # medians over each tracer's own steps differ, by context alone
    assert sorted(ref.values())[200] - sorted(ours.values())[15] == 25_000
    m = tb.matched_kernel(by_ref, by_ours)
    assert m["matched_steps"] == 10  # contexts 300, 310 .. 390
    assert m["kernel_ref_us"] == pytest.approx(m["kernel_ours_us"])
    assert tb.matched_kernel(by_ref, {})["kernel_ref_us"] is None


def test_the_truth_of_a_window_is_the_reference_kernel_time_at_each_step_context():
    ref = {100: 40_000, 200: 60_000}  # ns at context 100 and 200
    steps = [crec(0, 100, 0, 80), crec(1, 150, 100, 180), crec(2, 300, 200, 250)]
    # 40 + 50 (interpolated) + min(60, 50: the span) us over 300 us
    assert tb.truth_busy(steps, ref, 0, 300_000) == pytest.approx(140 / 300)
    # half of step 1's span inside the window: half its kernel time
    assert tb.truth_busy(steps, ref, 0, 140_000) == pytest.approx((40 + 25) / 140)
    assert tb.truth_busy(steps, {}, 0, 300_000) is None
