"""On a CPU-only engine no figure speaks of a GPU, kernels or CUDA graphs (issue 25, 13):
the compute lane is a worker thread there, and what measures a GPU is left out."""

from __future__ import annotations

import plotly.graph_objects as go

from telemetry.records import Span, StepRecord
from ui.gauges import gauge_values, gauges_figure

MS = 1_000_000


def recs() -> list[StepRecord]:
    return [StepRecord(step=k, mode="sync", slot=0, num_requests=2,  # type: ignore[arg-type]
                       prefill_tokens=0, decode_tokens=2,
                       spans=[Span("cpu.prepare", 10 * k * MS, (10 * k + 2) * MS),
                              Span("compute", (10 * k + 2) * MS, (10 * k + 9) * MS)])
            for k in range(10)]


def words(fig: go.Figure) -> str:
    return " | ".join(t.title.text for t in fig.data)


def test_cpu_gauges_have_no_gpu_kernel_or_graphs_wording() -> None:
    v = gauge_values(recs(), (0, 100 * MS), nvml_reason="no GPU: NVML is not available",
                     max_num_seqs=8)
    cpu = words(gauges_figure(v, device="cpu"))
    for word in ("GPU", "kernel", "graphs", "NVML", "GPM"):
        assert word not in cpu, (word, cpu)
    assert "compute idle" in cpu and "compute worker thread busy" in cpu
    fig = gauges_figure(v, device="cpu")
    assert len(fig.data) == 7 and fig.layout.grid.columns == 4
    cells = {(t.domain.row, t.domain.column) for t in fig.data}
    assert len(cells) == 7  # no two indicators on one cell


def test_gpu_gauges_keep_their_gpu_figures() -> None:
    v = gauge_values(recs(), (0, 100 * MS), max_num_seqs=8)
    gpu = words(gauges_figure(v, device="cuda"))
    assert "GPU idle" in gpu and "kernel busy" in gpu and "NVML utilisation" in gpu
    assert len(gauges_figure(v).data) == 10
