"""The kernel lane and the waterfall bar, fed by the fake engine's recorded kernel samples
(as the engine's sampler publishes them: a sample rides on the next step's record)."""

from __future__ import annotations

import pytest

from telemetry.records import StepRecord
from tests.ui.fake_engine import FakeEngineClient
from ui.figures.anatomy import step_timeline_figure
from ui.figures.kernel_lane import (
    NO_KERNELS,
    NONE_IN_WINDOW,
    NOT_MEASURED,
    kernel_lane_figure,
    samples_of,
)
from ui.figures.timeline import window_end_ns
from ui.figures.waterfall import NO_KERNELS as WF_NO_KERNELS
from ui.figures.waterfall import waterfall_figure


def records_of(client: FakeEngineClient, n: int = 20) -> list[StepRecord]:
    client.publish_steps(n)
    return client.telemetry().snapshot_steps(1000)


def test_sampled_steps_show_their_kernels_by_family_and_the_rest_say_not_measured():
    recs = records_of(FakeEngineClient(graphs_available=True))
    samples = samples_of(recs)
    assert samples, "the fake engine publishes kernel samples on a GPU"
    fig = kernel_lane_figure(recs, samples, end_ns=window_end_ns(recs), window_ms=100)
    names = {t.name: t for t in fig.data}
    assert {"gemm", "attention", "norm"} <= set(names)
    assert "nvjet_tst_128x64_gemm" in names["gemm"].hovertext[0]
    sampled = {st.step for s in samples for st in s.steps}
    (pale,) = [t for t in fig.data if t.name == NOT_MEASURED and "step" in t.hovertext[0]]
    assert len(pale.x) == len([r for r in recs if r.step not in sampled])
    assert all("not measured" in t for t in pale.hovertext)
    assert "kernels" in names["gemm"].hovertext[0] and "step" in names["gemm"].hovertext[0]
    assert not fig.layout.annotations


def test_on_a_cpu_each_tile_says_in_one_line_there_are_no_kernels():
    recs = records_of(FakeEngineClient(graphs_available=False))
    assert not samples_of(recs)
    lane = kernel_lane_figure(recs, [], end_ns=window_end_ns(recs), window_ms=100,
                              device="cpu")
    assert [a.text for a in lane.layout.annotations] == [NO_KERNELS]
    wf = waterfall_figure(recs, [], device="cpu")
    assert WF_NO_KERNELS in wf.layout.title.text
    assert {t.name for t in wf.data} <= {"cpu.schedule", "cpu.prepare", "cpu.launch",
                                         "cpu.wait", "cpu.post", "other"}


def test_a_window_without_samples_on_a_gpu_says_so():
    recs = records_of(FakeEngineClient(graphs_available=True))
    unsampled = [r for r in recs if not r.kernel_samples][:2]
    for r in unsampled:
        r.kernel_samples = []
    fig = kernel_lane_figure(unsampled, [], end_ns=window_end_ns(unsampled), window_ms=5)
    assert [a.text for a in fig.layout.annotations] == [NONE_IN_WINDOW]


def test_the_waterfall_bar_adds_up_to_the_window():
    recs = records_of(FakeEngineClient(graphs_available=True))
    fig = waterfall_figure(recs, samples_of(recs))
    comp = [s for r in recs for s in r.spans if s.lane == "compute"]
    wall_ms = (max(s.end_ns for s in comp) - min(s.start_ns for s in comp)) / 1e6
    assert abs(sum(t.x[0] for t in fig.data) - wall_ms) <= 0.01 * wall_ms
    assert "kernels above floor" in {t.name for t in fig.data}


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by ``intervals`` (ms)."""
    got, at = 0.0, lo
    for a, b in sorted(intervals):
        a, b = max(a, at), min(b, hi)
        if b > a:
            got, at = got + (b - a), b
    return got


def test_time_the_sampler_did_not_measure_is_drawn_not_measured_never_blank():
    """Blank lane reads as idle GPU: it may only be where a kernel sample measured. Between
    unsampled steps and before the first sample, the lane is covered by "not measured";
    inside a sample's window nothing is (its gaps are measured idle)."""
    recs = records_of(FakeEngineClient(graphs_available=True), n=30)
    samples = samples_of(recs)
    end = window_end_ns(recs)
    window_ms = 100.0
    fig = kernel_lane_figure(recs, samples, end_ns=end, window_ms=window_ms)
    pale = [(b, b + x) for t in fig.data if t.name == NOT_MEASURED
            for b, x in zip(t.base, t.x, strict=True)]
    windows = [((a - end) / 1e6, (b - end) / 1e6) for s in samples for a, b in [s.window]]
    windows = [(max(a, -window_ms), min(b, 0.0)) for a, b in windows if b > -window_ms]
    assert windows, "the window holds a sample"
    sampled_ms = _covered(windows, -window_ms, 0.0)
    assert sampled_ms < 0.9 * window_ms, "most of the window is not sampled"
    # every ms of the window is either inside a sample's window or drawn not measured
    assert _covered(pale + windows, -window_ms, 0.0) == pytest.approx(window_ms, rel=1e-3)
    # and no not-measured bar lies inside a sample's window (its blank is measured idle)
    band = next(t for t in fig.data if t.name == NOT_MEASURED and "not idle" in t.hovertext[0])
    for b, x in zip(band.base, band.x, strict=True):
        assert _covered(windows, b, b + x) == pytest.approx(0.0, abs=1e-6)


def test_kernel_samples_survive_a_recording_round_trip(tmp_path):
    from telemetry.export import write_jsonl
    from ui.figures.recordings import load_recording

    recs = records_of(FakeEngineClient(graphs_available=True))
    path = write_jsonl(tmp_path / "r.jsonl", recs)
    back = load_recording(path)
    assert samples_of(back.steps) == samples_of(recs)


def test_the_lane_says_when_the_profiler_returned_no_kernel_records():
    """The engine's stats say the last samples lost their kernel records: the lane says so
    (and how many), rather than only that no step was sampled."""
    from ui.figures.kernel_lane import sampler_note

    recs = records_of(FakeEngineClient(graphs_available=True))[:2]
    for r in recs:
        r.kernel_samples = []
    assert sampler_note({"kernel_samples_lost_in_row": 0}) is None and sampler_note(None) is None
    stats = {"kernel_samples_lost_in_row": 3, "kernel_sampler_error": "LostKernels: ..."}
    fig = kernel_lane_figure(recs, [], end_ns=window_end_ns(recs), window_ms=5, stats=stats)
    (text,) = [a.text for a in fig.layout.annotations]
    assert "no kernel record for the last 3 samples" in text
    cpu = kernel_lane_figure(recs, [], end_ns=window_end_ns(recs), window_ms=5, device="cpu",
                             stats=stats)
    assert [a.text for a in cpu.layout.annotations] == [NO_KERNELS]


def test_the_lane_and_the_step_anatomy_draw_a_family_in_one_colour():
    client = FakeEngineClient(graphs_available=True)
    recs = records_of(client)
    lane = kernel_lane_figure(recs, samples_of(recs), end_ns=window_end_ns(recs), window_ms=100)
    anatomy = step_timeline_figure(client.record_anatomy(2), 100)
    lane_colours = {t.name: t.marker.color for t in lane.data if t.name != NOT_MEASURED}
    anatomy_colours = {t.name: t.marker.color for t in anatomy.data}
    shared = set(lane_colours) & set(anatomy_colours)
    assert {"gemm", "attention", "norm"} <= shared
    assert {f: lane_colours[f] for f in shared} == {f: anatomy_colours[f] for f in shared}


def test_the_live_waterfall_adds_up_to_its_window_and_no_more(fake) -> None:
    """Steps of 300 ms, the newest ending now: the Live page's default 1,000 ms window cuts
    one of them. The waterfall counts only what lies inside the window (it once counted
    whole steps that overlap it: 1,086-1,290 ms for a 1,000 ms window)."""
    import time

    from test_pages_fake import app, live_figures

    from telemetry.bus import TelemetryBus
    from telemetry.records import Span

    ms = 1_000_000
    now = time.perf_counter_ns()
    fake.bus = TelemetryBus()
    for k in range(6):
        t = now - (6 - k) * 300 * ms
        fake.bus.publish_step(StepRecord(
            step=k, mode="sync", slot=0, num_requests=1, prefill_tokens=0, decode_tokens=1,
            spans=[Span("cpu.prepare", t, t + 20 * ms), Span("compute", t + 20 * ms,
                                                            t + 290 * ms)]))
    at = app().run()
    wf = live_figures(at)["live.waterfall"]
    total = sum(sum(t["x"]) if isinstance(t["x"], list) else 0 for t in wf["data"])
    assert total == pytest.approx(1000.0, abs=1.0), total
    assert "(1,000 ms)" in wf["layout"]["title"]["text"]
