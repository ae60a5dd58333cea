"""Gauge values from hand-made records, and the indicator figure that shows them."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import pytest

from telemetry.records import Span, StepRecord
from ui.figures.gauges import (
    NUMBER_FONT_PX,
    gauge_values,
    gauges_figure,
    live_window,
    nice_ceiling,
    steps_in_flight,
    window_busy,
)

MS = 1_000_000


def rec(n: int, compute: tuple[int, int], **kw: int) -> StepRecord:
    return StepRecord(
        step=n,
        mode="async",
        slot=0,
        num_requests=2,
        prefill_tokens=kw.pop("prefill", 0),
        decode_tokens=kw.pop("decode", 2),
        spans=[Span("compute", compute[0] * MS, compute[1] * MS)],
        **kw,
    )


def titles(fig: go.Figure) -> list[str]:
    """Each indicator's title and its subtitle (the annotation under it), as shown."""
    subs: dict[str, list[str]] = {}
    for a in fig.layout.annotations:
        if a.text != a.name:
            subs.setdefault(a.name, []).append(a.text.replace("<br>", " "))
    return [" · ".join([t.name, *subs.get(t.name, [])]) for t in fig.data]


def test_busy_idle_and_tokens_over_the_window() -> None:
    # Window [0, 100) ms; compute busy 0-30 and 50-70 ms; 4 steps x 2 decode tokens + 10.
    recs = [
        rec(0, (0, 10)),
        rec(1, (10, 30), prefill=10),
        rec(2, (50, 60)),
        rec(3, (60, 70), running=3, waiting=1, kv_blocks_used=5, kv_blocks_total=20),
    ]
    v = gauge_values(recs, (0, 100 * MS), max_num_seqs=8)
    assert v.gpu_busy == pytest.approx(0.5)
    assert v.idle_ms == pytest.approx(50.0) and v.idle_gaps == 2
    assert v.largest_gap_ms == pytest.approx(30.0)
    assert v.tokens_per_s == pytest.approx(18 / 0.1)
    assert v.decode_tokens_per_s == pytest.approx(8 / 0.1)
    assert (v.running, v.waiting, v.kv_usage) == (3, 1, 0.25)  # from the newest record
    assert v.nvml_util_pct is None


def test_engine_stats_and_nvml_take_precedence_over_records() -> None:
    recs = [rec(0, (0, 10), running=9, waiting=9)]
    v = gauge_values(
        recs,
        (0, 10 * MS),
        stats={"running": 2, "waiting": 0, "kv_blocks_used": 1, "kv_blocks_total": 4},
        nvml={"gpu_util_pct": 97.0},
        nvml_reason="unused",
    )
    assert (v.running, v.waiting, v.kv_usage) == (2, 0, 0.25)
    assert v.nvml_util_pct == 97.0 and v.nvml_reason is None


def test_live_window_ends_now_unless_the_clocks_differ() -> None:
    recs = [rec(0, (0, 10))]
    assert live_window(recs, now_ns=20 * MS, window_ms=5) == (15 * MS, 20 * MS, None)
    far = 10 * 60 * 1000 * MS  # ten minutes later: another clock domain
    assert live_window(recs, now_ns=far, window_ms=5) == (5 * MS, 10 * MS, None)
    with pytest.raises(ValueError):
        live_window(recs, now_ns=0, window_ms=0)


def test_a_step_in_flight_is_busy_never_idle() -> None:
    """Steps 0-2 published (compute back to back until 30 ms); the engine has launched
    step 3, still running at now = 55 ms: the 25 ms since the last published compute are
    that step's, busy, not an idle gap; the window still ends now, as the history strip's."""
    recs = [rec(0, (0, 10)), rec(1, (10, 20)), rec(2, (20, 30))]
    recs[2].spans.append(Span("cpu.post", 30 * MS, 34 * MS))
    stats = {"running": 2, "waiting": 0, "steps": 4, "unfinished": 2}
    assert steps_in_flight(recs, stats)
    window = live_window(recs, now_ns=55 * MS, window_ms=30, in_flight=True)
    assert window == (25 * MS, 55 * MS, 30 * MS)  # in flight since the last compute's end
    v = gauge_values(recs, window, stats=stats)
    assert v.idle_ms == 0 and v.largest_gap_ms == 0 and v.gpu_busy == pytest.approx(1.0)
    assert window_busy(recs, window) == pytest.approx(1.0)
    # A step in flight for longer than the window: all of it busy.
    window = live_window(recs, now_ns=500 * MS, window_ms=30, in_flight=True)
    assert gauge_values([], window, stats=stats).gpu_busy == pytest.approx(1.0)
    # Nothing in flight: the time after the last step is real idle and is shown.
    idle_stats = {"running": 0, "waiting": 0, "steps": 3, "unfinished": 0}
    assert not steps_in_flight(recs, idle_stats)
    window = live_window(recs, now_ns=55 * MS, window_ms=30, in_flight=False)
    v = gauge_values(recs, window, stats=idle_stats)
    assert v.largest_gap_ms == pytest.approx(25.0) and v.largest_gap_cause == "no_work"
    # Launched but not yet published (the wire is behind): still in flight.
    assert steps_in_flight(recs, {"running": 0, "steps": 5, "unfinished": 0})


def test_figure_shows_busy_beside_nvml_and_gpm_and_says_why_they_are_missing() -> None:
    v = gauge_values([rec(0, (0, 10))], (0, 20 * MS), nvml_reason="no GPU: NVML library not found")
    fig = gauges_figure(v)
    names = titles(fig)
    assert len(fig.data) == 10
    assert names[0].startswith("step busy") and names[1].startswith("kernel busy")
    assert names[2].startswith("NVML utilisation")
    assert names[3].startswith("memory bandwidth used (GPM)")
    assert (fig.data[0].domain.row, fig.data[0].domain.column) == (0, 0)
    assert (fig.data[2].domain.row, fig.data[2].domain.column) == (0, 2)
    assert fig.data[0].value == pytest.approx(50.0)
    assert "no GPU: NVML library not found" in names[2]
    assert "no GPU: NVML library not found" in names[3]
    assert "no kernel sample" in names[1]
    for k in (1, 2, 3):
        assert fig.data[k].mode == "gauge"  # no number drawn for a reading that does not exist
    for label in ("tokens/s", "KV cache", "running", "waiting", "idle"):
        assert any(label in n for n in names), label


def test_gpm_bandwidth_and_idle_causes_are_shown() -> None:
    recs = [rec(0, (0, 10)), rec(1, (15, 20))]
    recs[1].spans.append(Span("cpu.prepare", 10 * MS, 14 * MS))
    v = gauge_values(recs, (0, 20 * MS),
                     nvml={"gpu_util_pct": 99.0, "dram_bw_util_pct": 71.5, "gpm_reason": None})
    assert v.dram_bw_util_pct == 71.5 and v.gpm_reason is None
    assert v.idle_by_cause_ms["cpu"] == pytest.approx(5.0)  # 10-14 prepare, 14-15 between
    names = titles(gauges_figure(v))
    assert gauges_figure(v).data[3].value == 71.5
    assert "CPU schedule/prepare/launch 5.0 ms" in names[8]
    no_gpm = gauge_values(recs, (0, 20 * MS), nvml={
        "gpu_util_pct": 99.0, "dram_bw_util_pct": None,
        "gpm_reason": "GPM not supported on A100 (Hopper or newer needed)"})
    assert "Hopper or newer" in titles(gauges_figure(no_gpm))[3]


def test_kernel_busy_is_estimated_only_from_an_anatomy_calibration() -> None:
    from telemetry.anatomy import GapCalibration

    recs = [rec(0, (0, 10)), rec(1, (10, 20))]
    assert gauge_values(recs, (0, 20 * MS)).kernel_busy is None
    cal = GapCalibration({("eager", 2): 1 * MS}, 0.1, 2)  # 1 ms of each 10 ms step is gaps
    v = gauge_values(recs, (0, 20 * MS), calibration=cal)
    assert v.gpu_busy == pytest.approx(1.0) and v.kernel_busy == pytest.approx(0.9)
    assert "estimated" in titles(gauges_figure(v))[1]


# A shipped recording (bench truth, SmolLM2-135M b16, four modes): the step records of each
# mode's bare, reference and sampled windows, and the kernel samples.
H200_KERNELS = (Path(__file__).resolve().parents[2] / "docs" / "recordings"
                / "h200-smollm2-135m.jsonl")


def test_kernel_busy_is_measured_from_recorded_kernel_samples() -> None:
    """On unsampled graph steps (the sync + graphs bare window, no profiler) the gauge gives
    each step the sampled steps' kernel time (928-950 us a step, 290 kernels) over the
    window: between the fewest and the most sampled kernel time per step times the steps in
    it; and it says it is measured (not the sampled share of a stretched sampled span, which
    reads well under the reference kernels' busy share)."""
    from ui.figures.recordings import load_recording

    steps = load_recording(H200_KERNELS).steps
    samples = [k for r in steps for k in r.kernel_samples]
    first = next(i for i, r in enumerate(steps) if r.kernel_samples)
    bare = [r for r in steps[:first] if r.mode == "sync" and r.graph_bucket is not None
            and r.decode_tokens and not r.prefill_tokens][:200]
    comp = [next(s for s in r.spans if s.lane == "compute") for r in bare]
    window = (comp[0].start_ns, comp[-1].end_ns)
    v = gauge_values(bare, window, samples=samples, sampled_records=steps)
    per_step = [st.kernel_ns for k in samples for st in k.steps if st.kernels[0].family
                == "marker"]  # graph steps
    span = window[1] - window[0]
    assert v.kernel_busy_source == "sampled"
    assert min(per_step) * 0.99 * len(bare) / span <= v.kernel_busy
    assert v.kernel_busy <= max(per_step) * len(bare) / span
    assert v.kernel_busy < v.gpu_busy
    assert titles(gauges_figure(v))[1].startswith("kernel busy") and "measured" in titles(
        gauges_figure(v))[1]
    none = gauge_values(bare, window)  # no sample in the window's records, none given
    assert none.kernel_busy is None and "no kernel sample" in titles(gauges_figure(none))[1]


def test_kernel_busy_from_the_fake_engines_recorded_kernel_samples() -> None:
    """The fake engine publishes steps as a GPU engine does, with a kernel sample riding on
    the record after each fifth step (three kernels, 73,998 ns of its 80,000 ns compute span):
    every step of the window gets that kernel time, sampled or not."""
    from tests.ui.fake_engine import FakeEngineClient
    from ui.figures.kernel_lane import samples_of

    client = FakeEngineClient(graphs_available=True)
    client.publish_steps(40)
    # Only these 40: the 20 steps the fake publishes when built are timed from another clock
    # reading, so they overlap these by a jitter of the machine's and the window's kernel
    # time would come out a few percent high now and then.
    recs = client.telemetry().snapshot_steps(1000)[-40:]
    comp = [next(s for s in r.spans if s.lane == "compute") for r in recs]
    window = (comp[0].start_ns, comp[-1].end_ns)
    v = gauge_values(recs[20:], window, samples=samples_of(recs), sampled_records=recs)
    assert v.kernel_busy_source == "sampled"
    assert v.kernel_busy == pytest.approx(20 * 73_998 / (window[1] - window[0]), rel=1e-3)
    assert "measured" in titles(gauges_figure(v))[1]


def test_samples_are_kept_between_refreshes_with_their_steps_records() -> None:
    """A later snapshot without any sample still measures kernel busy from the kept ones."""
    from tests.ui.fake_engine import FakeEngineClient
    from ui.figures.gauges import keep_samples

    client = FakeEngineClient(graphs_available=True)
    client.publish_steps(12)  # a sample of each fifth step, on the next step's record
    snap = client.telemetry().snapshot_steps(1000)
    kept = keep_samples(snap)
    sampled = [st.step for k in kept[0] for st in k.steps]
    assert sampled and all(n % 5 == 0 for n in sampled)
    assert [k for r in snap for k in r.kernel_samples][-16:] == kept[0]
    assert [r.step for r in kept[1]] == sampled
    client.publish_steps(3)  # steps 12..14: no sample rides on them
    later = client.telemetry().snapshot_steps(1000)[-3:]
    assert not any(r.kernel_samples for r in later)
    again = keep_samples(later, kept)
    assert again == kept and keep_samples(later, kept, keep=1)[0] == kept[0][-1:]
    comp = [next(s for s in r.spans if s.lane == "compute") for r in later]
    v = gauge_values(later, (comp[0].start_ns, comp[-1].end_ns), samples=again[0],
                     sampled_records=again[1])
    assert v.kernel_busy_source == "sampled" and v.kernel_busy is not None


def test_nice_ceiling() -> None:
    assert [nice_ceiling(x) for x in (1, 3, 7, 100, 101, 2500)] == [1, 5, 10, 100, 200, 5000]


@pytest.mark.parametrize("device", [pytest.param("cuda", id="gpu-engine"),
                                    pytest.param("cpu", id="cpu-engine")])
def test_no_label_is_written_over_a_number_or_a_tick_label(device: str) -> None:
    """Each title is one line above its cell and each subtitle sits under its cell, outside
    it (a title's second line ran into the gauge's tick labels: "of max 16" over the "8");
    numbers have one size (left to Plotly, "0" filled its cell under "waiting requests");
    no two cells touch (the end labels "100" and "0" of neighbours ran together)."""
    v = gauge_values([rec(0, (0, 10))], (0, 20 * MS), stats={"running": 3, "waiting": 1},
                     max_num_seqs=16, nvml_reason="no GPU: NVML library not found")
    fig = gauges_figure(v, device=device)
    cells = {t.name: (tuple(t.domain.x), tuple(t.domain.y)) for t in fig.data}
    for t in fig.data:
        assert "<br>" not in (t.title.text or ""), t.title.text
        assert t.number.font.size == NUMBER_FONT_PX
    for a in fig.layout.annotations:
        (x0, x1), (y0, y1) = cells[a.name]
        assert x0 < a.x < x1
        if a.text == a.name:  # a number's title: above its cell
            assert a.y > y1 and a.yanchor == "bottom"
        else:  # a subtitle: under its cell, two lines at most
            assert a.y < y0 and a.yanchor == "top" and a.text.count("<br>") <= 1
    spans = sorted({x for x, _ in cells.values()})
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert any("of max 16" in a.text for a in fig.layout.annotations)
