"""The step waterfall on screen: one stacked bar per window, and one step's parts as text.

Owns the figure and the hover text; the arithmetic is telemetry.waterfall's. Without kernel
samples (a CPU, or none yet in the window) the bar shows the host's phases instead, and says
so in one line. Pure functions: no streamlit, no engine, no clock reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from telemetry.gaps import IdleBreakdown, idle_by_cause
from telemetry.kernels import KernelSample
from telemetry.records import StepRecord
from telemetry.waterfall import CAUSE_PART, COMPONENTS, LABELS, Waterfall, host_phases, waterfall

COLOURS: dict[str, str] = {
    "floor": "#1b7837",
    "kernels_above_floor": "#7fbf7b",
    "in_step_gaps": "#d9f0d3",
    "idle_cpu": "#2171b5",
    "idle_launch": "#a1d99b",
    "copies_sync": "#fd8d3c",
    "no_work": "#e0e0e0",
    "cpu.schedule": "#9ecae1",
    "cpu.prepare": "#4292c6",
    "cpu.launch": "#2171b5",
    "cpu.wait": "#bdbdbd",
    "cpu.post": "#08519c",
    "other": "#eeeeee",
}
NO_KERNELS = ("No kernels on a CPU: the waterfall shows the host's phases only (kernel time, "
              "gaps and the byte floor need a GPU).")
NOT_SAMPLED = ("No sampled step in this window yet: kernels are recorded for a few steps "
               "every kernel_sample_period_s; host phases shown.")


def window_bounds(records: Sequence[StepRecord]) -> tuple[int, int] | None:
    comp = [s for r in records for s in r.spans if s.lane == "compute"]
    if not comp:
        return None
    return min(s.start_ns for s in comp), max(s.end_ns for s in comp)


def waterfall_figure(records: Sequence[StepRecord], samples: Sequence[KernelSample],
                     *, device: str = "cuda", height_px: int = 120,
                     sampled_records: Sequence[StepRecord] = (),
                     window: tuple[int, int] | None = None) -> go.Figure:
    """One stacked bar: the wall time of ``window`` (``(start_ns, end_ns)``: the timeline's
    window; default, first compute start to last compute end) by waterfall part, or by host
    phase without samples, each part clipped to the window, so the bar adds up to it and no
    more (steps that only overlap the window count for their part inside it). Hover gives
    ms and share. ``sampled_records``: records of the sampled steps (kept across
    refreshes), whose kernel time per step the unsampled steps of the window are given."""
    fig = go.Figure()
    bounds = window_bounds(records) if window is None else window
    if bounds is not None and not records:
        bounds = None
    note = None
    if bounds is None:
        note = "no steps yet"
        parts: dict[str, float] = {}
        labels: dict[str, str] = {}
    else:
        lo, hi = bounds
        wf = waterfall(records, lo, hi, samples, sampled_records=sampled_records)
        if wf.kernel_ns is not None:
            parts = {k: float(v or 0) for k, v in wf.parts_ns.items()}
            labels = LABELS
        else:
            note = NO_KERNELS if device != "cuda" else NOT_SAMPLED
            parts = {k: float(v) for k, v in host_phases(records, lo, hi).items()}
            labels = {k: k for k in parts}
    total = sum(parts.values()) or 1.0
    for key, ns in parts.items():
        if ns <= 0:
            continue
        fig.add_trace(go.Bar(
            orientation="h", y=["window"], x=[ns / 1e6], name=labels.get(key, key),
            marker={"color": COLOURS.get(key, "#999999"), "line": {"width": 0}},
            hovertext=[f"<b>{labels.get(key, key)}</b> {ns / 1e6:.3f} ms "
                       f"({100 * ns / total:.1f}% of {total / 1e6:.2f} ms)"],
            hoverinfo="text"))
    span = "" if bounds is None else f" ({(bounds[1] - bounds[0]) / 1e6:,.0f} ms)"
    fig.update_layout(
        barmode="stack", height=height_px, margin={"l": 10, "r": 10, "t": 28, "b": 24},
        title={"text": f"Where the window's time went{span}" + (f" · {note}" if note else ""),
               "font": {"size": 13}, "x": 0.01},
        xaxis={"ticksuffix": " ms"}, yaxis={"visible": False},
        # One row under the axis, in the bar's order: a column beside the bar would need
        # its own scroll bar at this height.
        legend={"font": {"size": 10}, "orientation": "h", "yanchor": "top", "y": -0.35,
                "x": 0, "traceorder": "normal"})
    return fig


def step_parts_text(rec: StepRecord, records: Sequence[StepRecord],
                    samples: Sequence[KernelSample],
                    index: dict[int, StepRecord] | None = None,
                    sampled_records: Sequence[StepRecord] = ()) -> str:
    """One step's waterfall for its hover: its compute span split into kernels and gaps
    (measured when sampled, else by the sampled share), and the idle before it by cause.
    ``index`` (step -> record of `records`) spares a scan of `records` per step."""
    comp = [s for s in rec.spans if s.lane == "compute"]
    if not comp:
        return ""
    c = comp[0]
    wf: Waterfall = waterfall([rec], c.start_ns, c.end_ns, samples,
                              sampled_records=sampled_records or records)
    lines = []
    if wf.kernel_ns is not None:
        lines.append(f"kernels {wf.kernel_ns / 1e3:.1f} us · gaps "
                     f"{(wf.parts_ns['in_step_gaps'] or 0) / 1e3:.1f} us")
    if index is None:
        index = {r.step: r for r in records}
    prev = [index[n] for n in (rec.step - 2, rec.step - 1) if n in index]
    ends = [s.end_ns for r in prev for s in r.spans if s.lane == "compute"]
    if ends and max(ends) < c.start_ns:
        idle = idle_by_cause([*prev, rec], max(ends), c.start_ns)
        causes = ", ".join(f"{LABELS[k]} {v / 1e3:.1f} us" for k, v in _idle_parts(idle)
                           if v)
        if causes:
            lines.append(f"idle before it: {causes}")
    return "<br>".join(lines)


def _idle_parts(idle: IdleBreakdown) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for cause, ns in idle.by_cause.items():
        out[CAUSE_PART[cause]] = out.get(CAUSE_PART[cause], 0) + ns
    return [(k, out[k]) for k in COMPONENTS if k in out]
