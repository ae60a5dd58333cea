"""Step anatomy, pure part: kernels found by their graph launch's correlation id, grouped
per step and per family, timed against the step's span and byte floor, and the kernel-busy
estimate calibrated from a recording."""

from __future__ import annotations

import pytest

from telemetry.anatomy import (
    anatomy_chrome_trace,
    family_table,
    floor_figures,
    gap_calibration,
    group_by_step,
    kernel_busy,
    kernel_busy_estimate,
    step_key,
)


def ev(cat: str, name: str, ts: float, dur: float, corr: int | None = None, tid: int = 1):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": {}}
    if corr is not None:
        e["args"]["correlation"] = corr
    return e


def kineto_two_graph_steps() -> list[dict]:
    """Two steps, each one cudaGraphLaunch (correlation 10, 20) on the loop thread; the
    graph's kernels run on the device (another tid) later; a stray kernel (no step)."""
    out = [
        ev("user_annotation", "gapless.step 7", 0, 30),
        ev("cuda_runtime", "cudaGraphLaunch", 5, 20, corr=10),
        ev("user_annotation", "gapless.step 8", 100, 30),
        ev("cuda_runtime", "cudaGraphLaunch", 105, 20, corr=20),
        ev("cuda_runtime", "cudaLaunchKernel", 300, 5, corr=99),
        ev("kernel", "other_unrelated", 310, 5, corr=99, tid=7),
    ]
    for base, corr in ((40, 10), (140, 20)):
        out += [
            ev("kernel", "nvjet_tst_128x64_gemm", base, 40, corr, tid=7),
            ev("kernel", "triton_rms_norm_kernel", base + 42, 4, corr, tid=7),
            ev("kernel", "_paged_attention_kernel", base + 50, 10, corr, tid=7),
            ev("kernel", "vectorized_elementwise_kernel<silu>", base + 60, 6, corr, tid=7),
            ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", base + 66, 2, corr, tid=7),
        ]
    return out


def test_a_steps_host_copies_do_not_stretch_its_span() -> None:
    """Async: step 8's H2D copy (its own stream) runs while step 7's graph computes, and
    step 7's D2H after it; counted in, they would make a step's span twice its kernels. A
    step's span is its compute work only."""
    events = kineto_two_graph_steps() + [
        ev("cuda_runtime", "cudaMemcpyAsync", 101, 2, corr=21),
        ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 70, 3, corr=21, tid=8),
        ev("cuda_runtime", "cudaMemcpyAsync", 26, 2, corr=11),
        ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 112, 2, corr=11, tid=9),
    ]
    s7, s8 = group_by_step(events)
    assert s7.span_us == pytest.approx(68) and s8.span_us == pytest.approx(68)
    assert len(s7.kernels) == len(s8.kernels) == 5


def test_kernels_join_the_step_whose_graph_launched_them() -> None:
    steps = group_by_step(kineto_two_graph_steps())
    assert [s.step for s in steps] == [7, 8]
    s7 = steps[0]
    assert len(s7.kernels) == 5 and "other_unrelated" not in {k.name for k in s7.kernels}
    assert s7.span_us == pytest.approx(68)  # 40 .. 108
    assert s7.kernel_us == pytest.approx(40 + 4 + 10 + 6 + 2)
    assert s7.gap_us == pytest.approx(6)


def test_family_table_and_floor() -> None:
    steps = group_by_step(kineto_two_graph_steps())
    rows = {r.family: r for r in family_table(steps)}
    assert set(rows) == {"gemm", "norm", "attention", "elementwise", "copies"}
    assert rows["gemm"].count == 1 and rows["gemm"].time_us == pytest.approx(40)
    assert rows["gemm"].share == pytest.approx(40 / 62)
    assert family_table(steps)[0].family == "gemm"  # biggest first
    f = floor_figures(steps[0], floor_bytes=34_000, peak_bw=1e9)  # 34 us at 1 GB/s
    assert f.floor_us == pytest.approx(34) and f.times_floor == pytest.approx(2.0)
    assert f.achieved_bw == pytest.approx(34_000 / 68e-6)
    with pytest.raises(ValueError, match="peak_bw"):
        floor_figures(steps[0], 1, 0)


def test_kernel_busy_and_its_estimate_from_a_calibration() -> None:
    events = kineto_two_graph_steps()
    # Kernels cover 62 us of each 68 us step; window 40 .. 208 holds both steps.
    assert kernel_busy(events, (40, 208), ("kernel", "gpu_memcpy")) == pytest.approx(124 / 168)
    steps = group_by_step(events)
    cal = gap_calibration(steps, {7: step_key(32, 32), 8: step_key(32, 32)})
    assert cal.gap_ns == {32: pytest.approx(6000.0)} and cal.steps == 2
    assert cal.gap_fraction == pytest.approx(6 / 68)
    est = kernel_busy_estimate(136_000, [(32, 68_000), (32, 68_000)], 168_000, cal)
    assert est == pytest.approx(124 / 168)
    # An eager step of a size never recorded takes the overall gap share of its span.
    eager = kernel_busy_estimate(68_000, [(step_key(None, 5), 68_000)], 100_000, cal)
    assert eager == pytest.approx(62 / 100)
    assert step_key(None, 5) != step_key(None, 6) and step_key(16, 5) == 16


def test_compact_trace_has_a_row_per_family_and_the_step_spans() -> None:
    trace = anatomy_chrome_trace(group_by_step(kineto_two_graph_steps()))
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"step", "gemm", "attention", "copies"} <= names
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 1]
    assert [(e["name"], e["dur"]) for e in spans] == [("step 7", 68.0), ("step 8", 68.0)]


def test_kernel_busy_of_a_live_window_prorates_steps_cut_by_the_window() -> None:
    from telemetry.anatomy import GapCalibration, kernel_busy_of_window
    from telemetry.records import Span, StepRecord

    def rec(n: int, a_us: int, b_us: int) -> StepRecord:
        return StepRecord(step=n, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                          decode_tokens=32, graph_bucket=32,
                          spans=[Span("compute", a_us * 1000, b_us * 1000)])

    cal = GapCalibration({32: 10_000.0}, 0.1, 4)  # 10 us of every bucket-32 step is gaps
    recs = [rec(0, 0, 100), rec(1, 100, 200)]
    assert kernel_busy_of_window(recs, 0, 200_000, cal) == pytest.approx(180 / 200)
    # Half of step 1 inside the window: half its gap is subtracted.
    assert kernel_busy_of_window(recs, 0, 150_000, cal) == pytest.approx(135 / 150)


def test_a_step_whose_kernels_the_profiler_dropped_is_not_measured_never_idle() -> None:
    """Step 8's graph kernels have no record (Kineto dropped them) and step 9 lost one of its
    two launches: neither may show a gap between kernels that reads as idle GPU. The summary
    and the page's step table list them as not measured, with why."""
    from telemetry.anatomy import summary_dict
    from ui.figures.anatomy import step_rows, step_timeline_figure

    events = [e for e in kineto_two_graph_steps()
              if not (e["cat"] != "cuda_runtime" and e["args"].get("correlation") == 20)]
    events += [
        ev("user_annotation", "gapless.step 9", 200, 30),
        ev("cuda_runtime", "cudaLaunchKernel", 202, 2, corr=30),
        ev("kernel", "nvjet_tst_128x64_gemm", 240, 40, corr=30, tid=7),
        ev("cuda_runtime", "cudaLaunchKernel", 210, 2, corr=31),  # its kernel: no record
    ]
    steps = group_by_step(events)
    assert [(s.step, s.measured, s.lost_launches) for s in steps] == [
        (7, True, 0), (8, False, 1), (9, False, 1)]
    summary = summary_dict(steps, device="cuda", first_step=7)
    assert [s["step"] for s in summary["steps"]] == [7]
    assert [u["step"] for u in summary["not_measured"]] == [8, 9]
    rows = {r["step"]: r for r in step_rows(summary)}
    assert list(rows) == [7, 8, 9]
    assert rows[7]["between kernels (us)"] == pytest.approx(6) and rows[7]["measured"] == "yes"
    for n in (8, 9):
        assert rows[n]["measured"].startswith("not measured: ")
        assert rows[n]["between kernels (us)"] is None and rows[n]["inside kernels (us)"] is None
    assert "dropped" in rows[9]["measured"]
    with pytest.raises(ValueError, match="step 9 was not measured"):
        step_timeline_figure(summary, 9)
    # the in-step gap calibration takes measured steps only
    cal = gap_calibration(steps, {7: "g", 8: "g", 9: "g"})
    assert cal.steps == 1 and cal.gap_ns["g"] == pytest.approx(6000)
