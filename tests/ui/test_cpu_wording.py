"""On a CPU-only engine no figure speaks of a GPU, kernels or CUDA graphs: the compute lane is
a worker thread there, and what measures a GPU is left out, or says why it cannot measure:
no empty kernel lane, no empty unlabelled "compute.launch" row, no "n/a" without a reason,
and no Step anatomy page asking for load it could not record."""

from __future__ import annotations

import plotly.graph_objects as go
from fake_engine import FakeEngineClient
from test_gauges import titles
from test_pages_fake import app, live_figures

from telemetry.records import Span, StepRecord
from ui.figures.gauges import gauge_values, gauges_figure
from ui.figures.history import history_figure, memory_bandwidth_reason, series_from_buckets
from ui.figures.timeline import timeline_figure

MS = 1_000_000


def recs() -> list[StepRecord]:
    return [StepRecord(step=k, mode="sync", slot=0, num_requests=2,  # type: ignore[arg-type]
                       prefill_tokens=0, decode_tokens=2,
                       spans=[Span("cpu.prepare", 10 * k * MS, (10 * k + 2) * MS),
                              Span("compute", (10 * k + 2) * MS, (10 * k + 9) * MS)])
            for k in range(10)]


def words(fig: go.Figure) -> str:
    return " | ".join(titles(fig))


def test_cpu_gauges_have_no_gpu_kernel_or_graphs_wording() -> None:
    v = gauge_values(recs(), (0, 100 * MS), nvml_reason="no GPU: NVML is not available",
                     max_num_seqs=8)
    cpu = words(gauges_figure(v, device="cpu"))
    for word in ("GPU", "kernel", "graphs", "NVML", "GPM"):
        assert word not in cpu, (word, cpu)
    assert "compute idle" in cpu and "compute worker thread busy" in cpu
    fig = gauges_figure(v, device="cpu")
    assert len(fig.data) == 7 and max(t.domain.column for t in fig.data) == 3
    cells = {(t.domain.row, t.domain.column) for t in fig.data}
    assert len(cells) == 7  # no two indicators on one cell


def test_gpu_gauges_keep_their_gpu_figures() -> None:
    v = gauge_values(recs(), (0, 100 * MS), max_num_seqs=8)
    gpu = words(gauges_figure(v, device="cuda"))
    assert "GPU idle" in gpu and "kernel busy" in gpu and "NVML utilisation" in gpu
    assert len(gauges_figure(v).data) == 10


def test_on_a_cpu_the_live_page_draws_no_empty_kernel_lane(fake: FakeEngineClient) -> None:
    at = app().run()
    figs = live_figures(at)
    assert "live.kernels" not in figs, list(figs)
    assert "No kernels on a CPU" in figs["live.waterfall"]["layout"]["title"]["text"]


def test_a_lane_only_a_gpu_fills_is_no_empty_row_on_a_cpu() -> None:
    cpu = timeline_figure(recs(), window_ms=100)
    assert "compute.launch" not in cpu.layout.yaxis.ticktext
    assert "compute" in cpu.layout.yaxis.ticktext and "h2d" in cpu.layout.yaxis.ticktext
    gpu = recs()
    gpu[0].spans.append(Span("compute.launch", 1 * MS, 2 * MS))
    assert "compute.launch" in timeline_figure(gpu, window_ms=100).layout.yaxis.ticktext


def test_the_memory_bandwidth_tile_says_why_it_cannot_measure() -> None:
    s = series_from_buckets({}, now_ns=10 * 1_000_000_000, seconds=5)
    s.mem_bw_reason = memory_bandwidth_reason(None, "no GPU: NVML library not found", "cpu")
    texts = [a.text for a in history_figure(s).layout.annotations]
    assert "memory bandwidth used: no GPU here" in texts
    assert not [t for t in texts if "n/a" in t], texts
    s.mem_bw_reason = memory_bandwidth_reason({"gpm_reason": "GPM is not supported on this "
                                               "GPU"}, None, "cuda")
    texts = [a.text for a in history_figure(s).layout.annotations]
    assert "memory bandwidth used: not measured" in texts
    assert "GPM is not supported on this GPU" in texts


def test_the_anatomy_page_on_a_cpu_asks_for_no_load(fake: FakeEngineClient) -> None:
    at = app().run()
    at.switch_page("ui/pages/anatomy.py").run()
    said = " ".join(c.value for c in at.caption) + " ".join(i.value for i in at.info)
    assert "load generator" not in said, said
    assert "needs an engine on a GPU" in said
