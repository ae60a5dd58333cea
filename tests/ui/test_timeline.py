"""The timeline figure from hand-made StepRecords: lanes, bases, durations, merging, hover."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from telemetry.records import LANES, Span, StepRecord
from ui.figures.lanes import CPU_GROUP, DEVICE_GROUP
from ui.figures.timeline import (
    GPU_ONLY_LANES,
    lane_bars,
    lane_row,
    merge_thin,
    recent_window,
    timeline_figure,
)

MS = 1_000_000


def step(n: int, spans: list[Span], **kw: object) -> StepRecord:
    facts: dict[str, object] = {
        "mode": "async",
        "slot": n % 2,
        "num_requests": 4,
        "prefill_tokens": 0,
        "decode_tokens": 4,
    }
    facts.update(kw)
    return StepRecord(step=n, spans=spans, **facts)  # type: ignore[arg-type]


def trace_for(fig: go.Figure, lane: str) -> go.Bar:
    (trace,) = [t for t in fig.data if t.name.split(":")[0] == lane]
    return trace


# Every lane but those only a GPU engine fills, which are drawn where records carry them.
DRAWN_LANES = [lane for lane in LANES if lane not in GPU_ONLY_LANES]


def test_one_trace_per_lane_in_lanes_order_top_to_bottom() -> None:
    fig = timeline_figure([step(0, [Span("compute", 0, MS)])])
    assert [t.name.split(":")[0] for t in fig.data] == DRAWN_LANES
    assert list(fig.layout.yaxis.ticktext) == DRAWN_LANES
    assert list(fig.layout.yaxis.tickvals) == [float(i) for i in range(len(DRAWN_LANES))]
    gpu = timeline_figure([step(0, [Span("compute.launch", 0, 10), Span("compute", 10, MS)])])
    assert list(gpu.layout.yaxis.ticktext) == list(LANES)
    lo, hi = fig.layout.yaxis.range
    assert lo > hi, "y axis must be reversed so that LANES[0] is drawn on top"


def test_span_lands_on_its_lane_row_with_base_and_duration_in_ms_before_the_end() -> None:
    recs = [
        step(0, [Span("cpu.prepare", 0, 2 * MS), Span("compute", 3 * MS, 8 * MS)]),
        step(1, [Span("d2h", 8 * MS, 10 * MS)]),
    ]
    fig = timeline_figure(recs, width_px=10_000)
    compute = trace_for(fig, "compute")
    assert list(compute.y) == [float(lane_row("compute", tuple(DRAWN_LANES)))] == [
        float(DRAWN_LANES.index("compute"))]
    assert compute.base[0] == pytest.approx(-7.0)  # 3 ms, window ends at 10 ms
    assert compute.x[0] == pytest.approx(5.0)
    prep = trace_for(fig, "cpu.prepare")
    assert prep.base[0] == pytest.approx(-10.0) and prep.x[0] == pytest.approx(2.0)
    assert len(trace_for(fig, "h2d").x) == 0
    assert tuple(fig.layout.xaxis.range) == pytest.approx((-10.0, 0.0))


def test_sub_millisecond_durations_are_kept_exactly() -> None:
    # px.timeline would round this 37 µs span to 0 ms.
    fig = timeline_figure(
        [step(0, [Span("cpu.launch", 0, 37_000), Span("compute", 0, MS)])], width_px=100_000
    )
    assert trace_for(fig, "cpu.launch").x[0] == pytest.approx(0.037)


def test_hover_text_has_the_step_facts() -> None:
    rec = step(
        42,
        [Span("compute", 0, MS)],
        mode="sync",
        slot=1,
        num_requests=7,
        prefill_tokens=100,
        decode_tokens=6,
        padded_tokens=2,
        graph_bucket=8,
    )
    text = trace_for(timeline_figure([rec]), "compute").hovertext[0]
    for fact in (
        "step 42",
        "sync",
        "slot 1",
        "requests 7",
        "prefill 100",
        "decode 6",
        "padded 2",
        "graph bucket 8",
        "1.000 ms",
    ):
        assert fact in text, (fact, text)
    eager = step(1, [Span("compute", 0, MS)], graph_bucket=None)
    assert "eager" in trace_for(timeline_figure([eager]), "compute").hovertext[0]


def test_thin_spans_merge_and_wide_spans_do_not() -> None:
    s = np.array([0, 10, 20, 1000, 5000], dtype=np.int64)
    e = np.array([5, 15, 25, 3000, 5004], dtype=np.int64)
    o = np.arange(5, dtype=np.int64)
    ms, me, first, last, count = merge_thin(s, e, o, min_ns=50)
    assert list(ms) == [0, 1000, 5000]
    assert list(me) == [25, 3000, 5004]
    assert list(count) == [3, 1, 1]
    assert list(first) == [0, 3, 4] and list(last) == [2, 3, 4]


def test_thin_spans_far_apart_stay_separate() -> None:
    s = np.array([0, 1000], dtype=np.int64)
    ms, _, _, _, count = merge_thin(s, s + 5, np.arange(2), min_ns=50)
    assert list(ms) == [0, 1000] and list(count) == [1, 1]


def test_figure_merges_spans_thinner_than_a_pixel_and_says_so_in_hover() -> None:
    # 100 launches of 1 µs, 2 µs apart, in a 1 s window 1000 px wide (1 px = 1 ms).
    recs = [step(i, [Span("cpu.launch", i * 3_000, i * 3_000 + 1_000)]) for i in range(100)]
    recs.append(step(100, [Span("compute", 0, 1000 * MS)]))
    fig = timeline_figure(recs, width_px=1000)
    launch = trace_for(fig, "cpu.launch")
    assert len(launch.x) == 1
    assert "100 spans merged" in launch.hovertext[0] and "steps 0-99" in launch.hovertext[0]
    assert len(trace_for(fig, "compute").x) == 1


def test_window_clips_and_drops_old_spans() -> None:
    recs = [
        step(0, [Span("compute", 0, MS)]),
        step(1, [Span("compute", 5 * MS, 15 * MS)]),
        step(2, [Span("compute", 16 * MS, 20 * MS)]),
    ]
    bars = lane_bars(recs, start_ns=10 * MS, end_ns=20 * MS)["compute"]
    assert list(bars.start_ns) == [10 * MS, 16 * MS]  # step 0 dropped, step 1 clipped
    assert list(bars.owner) == [1, 2]
    fig = timeline_figure(recs, window_ms=10, width_px=10_000)
    assert list(trace_for(fig, "compute").base) == pytest.approx([-10.0, -4.0])


def test_recent_window_keeps_overlapping_steps_in_order() -> None:
    recs = [step(i, [Span("compute", i * 10 * MS, i * 10 * MS + 5 * MS)]) for i in range(10)]
    kept = recent_window(recs, window_ms=25)  # window [70, 95] ms
    assert [r.step for r in kept] == [7, 8, 9]
    assert recent_window([], window_ms=10) == []
    with pytest.raises(ValueError, match="window_ms"):
        recent_window(recs, window_ms=0)


def test_unknown_lanes_are_ignored_and_empty_input_draws_every_lane() -> None:
    fig = timeline_figure([step(0, [Span("gpu.mystery", 0, MS)])])
    assert [t.name.split(":")[0] for t in fig.data] == DRAWN_LANES
    assert all(len(t.x) == 0 for t in fig.data)
    assert "no steps yet" in fig.layout.annotations[0].text
    assert [t.name.split(":")[0] for t in timeline_figure([]).data] == DRAWN_LANES


def test_legend_groups_lanes_cpu_and_device_with_a_meaning_for_each() -> None:
    fig = timeline_figure([step(0, [Span("compute", 0, MS)])])
    groups = {t.name.split(":")[0]: t.legendgroup for t in fig.data}
    assert groups["cpu.wait"] == CPU_GROUP and groups["compute"] == DEVICE_GROUP
    assert all(t.showlegend for t in fig.data)
    wait = trace_for(fig, "cpu.wait")
    assert "waits for the device" in wait.name  # the lane's one-line meaning


def test_a_live_window_keeps_one_x_range_so_a_zoom_survives_refreshes() -> None:
    # The range must not move with the data: plotly keeps a user's zoom across
    # Plotly.react only while the figure's own range and uirevision stay the same.
    a = timeline_figure([step(0, [Span("compute", 0, MS)])], window_ms=250, uirevision="x")
    b = timeline_figure([step(9, [Span("compute", 50 * MS, 90 * MS)])], window_ms=250,
                        uirevision="x")
    assert tuple(a.layout.xaxis.range) == tuple(b.layout.xaxis.range) == (-250.0, 0.0)
    assert a.layout.uirevision == b.layout.uirevision == "x"
    assert a.layout.xaxis.ticksuffix == " ms"


def test_highlighted_steps_are_drawn_lit_and_the_others_faded() -> None:
    """The Requests page's link lights a request's own steps on the timeline."""
    from ui.figures.timeline import FADED_OPACITY

    records = [StepRecord(step=k, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                          decode_tokens=1,
                          spans=[Span("compute", k * 1_000_000, k * 1_000_000 + 500_000)])
               for k in range(6)]
    fig = timeline_figure(records, highlight_steps=[2, 3], width_px=1000)
    (compute,) = [t for t in fig.data if t.name.startswith("compute:")]
    steps = [int(h.split("step ")[1].split(" ")[0]) for h in compute.hovertext]
    opacity = dict(zip(steps, compute.marker.opacity, strict=True))
    assert opacity == {0: FADED_OPACITY, 1: FADED_OPACITY, 2: 1.0, 3: 1.0,
                       4: FADED_OPACITY, 5: FADED_OPACITY}
    plain = timeline_figure(records, width_px=1000)
    (compute,) = [t for t in plain.data if t.name.startswith("compute:")]
    assert compute.marker.opacity is None  # nothing highlighted: every span at full strength


def test_a_figure_is_made_tall_enough_for_its_legend() -> None:
    """A legend taller than its plot would get a scroll bar of its own (the A/B
    page's 300 px timelines). Every lane drawn, and four ranks' lanes more, need more."""
    from ui.figures.timeline import legend_height_px

    lanes = [*LANES] + [f"rank{r}.{k}" for r in range(1, 5) for k in ("compute", "comm")]
    records = [StepRecord(step=0, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                          decode_tokens=1,
                          spans=[Span(lane, 0, 500_000) for lane in lanes])]
    fig = timeline_figure(records, height_px=300, title="t", legend=True)
    bars = lane_bars(records, lanes=[*LANES, *lanes[len(LANES):]])
    assert fig.layout.height >= legend_height_px(bars) + 70 > 300
    assert timeline_figure(records, height_px=300, legend=False).layout.height == 300
