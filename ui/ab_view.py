"""The A/B view: two windows of steps (two modes) side by side on one time scale.

Owns the figure comparing two WindowStats (steps/s with its spread, step period, the CPU's
share of a step, compute idle by cause) and ``show_ab``, which the A/B page (live captures)
and the Recordings page (a recording's modes) both draw: a verdict in plain words, the
figures, and both timelines over the same span of milliseconds. It must never call the
engine: it is handed records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from telemetry.records import StepRecord
from ui.compare import spread, verdict
from ui.timeline import timeline_figure
from ui.window_stats import IDLE_CAUSES, OTHER_CAUSE, WindowStats, window_stats

COLOURS = ("#6baed6", "#fd8d3c")
CAUSE_COLOURS = ("#4292c6", "#08519c", "#fd8d3c", "#bdbdbd")
SPANS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000)


@dataclass(slots=True)
class Window:
    """A window of steps to compare: a live capture or one mode of a recording."""

    label: str
    records: list[StepRecord]
    start_ns: int | None = None
    end_ns: int | None = None


def ab_figure(a: WindowStats, b: WindowStats, height_px: int = 260) -> go.Figure:
    titles = ("steps/s (bar: median of sub-windows, line: spread)", "step period (ms)",
              "CPU work per step (% of a step)", "compute idle by cause (ms per s)")
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.07)
    for s, colour in zip((a, b), COLOURS, strict=True):
        sp = spread(s.sub_steps_per_s) if s.sub_steps_per_s else None
        fig.add_trace(go.Bar(
            x=[s.label], y=[sp.median if sp else s.steps_per_s], marker_color=colour,
            error_y=None if sp is None else {
                "type": "data", "symmetric": False, "array": [sp.hi - sp.median],
                "arrayminus": [sp.median - sp.lo]},
            hovertemplate="%{y:,.1f} steps/s<extra></extra>", showlegend=False), 1, 1)
        fig.add_trace(go.Bar(x=[s.label], y=[s.step_ms], marker_color=colour, showlegend=False,
                             hovertemplate="%{y:,.3f} ms<extra></extra>"), 1, 2)
        fig.add_trace(go.Bar(x=[s.label], y=[100 * s.cpu_share], marker_color=colour,
                             showlegend=False, hovertemplate="%{y:.1f}%<extra></extra>"), 1, 3)
    causes = [name for name, _ in IDLE_CAUSES] + [OTHER_CAUSE]
    for cause, colour in zip(causes, CAUSE_COLOURS, strict=True):
        fig.add_trace(go.Bar(
            x=[a.label, b.label],
            y=[s.idle_by_cause_ms.get(cause, 0.0) / s.duration_s for s in (a, b)],
            name=cause, marker_color=colour, legendgroup="idle",
            hovertemplate=f"{cause}: %{{y:,.1f}} ms per s<extra></extra>"), 1, 4)
    fig.update_layout(barmode="stack", height=height_px,
                      margin={"l": 30, "r": 10, "t": 40, "b": 60},
                      legend={"orientation": "h", "y": -0.18, "x": 0.76, "xanchor": "left",
                              "font": {"size": 10}, "traceorder": "normal"})
    fig.update_annotations(font_size=12)
    fig.update_yaxes(ticksuffix=" ms", row=1, col=2)
    fig.update_yaxes(ticksuffix="%", row=1, col=3)
    return fig


def headline(a: WindowStats, b: WindowStats) -> tuple[bool, str]:
    """The steps/s verdict, and what async could gain at most here (the CPU's share)."""
    v = verdict(spread(a.sub_steps_per_s), spread(b.sub_steps_per_s), a_label=a.label,
                b_label=b.label, what="steps/s", fmt=",.1f")
    share = max(a.cpu_share, b.cpu_share)
    note = (
        f" The CPU's own work is {100 * a.cpu_share:.1f}% of a step in {a.label} and "
        f"{100 * b.cpu_share:.1f}% in {b.label}: overlapping it with the device (async) can "
        f"save at most about that share of each step."
    )
    if share < 0.05:
        note += " Here it is small, so the device's time decides and the modes look alike."
    return v.measurable, v.text + note


def show_ab(a: Window, b: Window, *, key: str) -> None:
    """Verdict, figures side by side, and both timelines over one span of milliseconds."""
    try:
        sa = window_stats(a.records, a.label, a.start_ns, a.end_ns)
        sb = window_stats(b.records, b.label, b.start_ns, b.end_ns)
    except ValueError as exc:
        st.error(f"Cannot compare: {exc}")
        return
    measurable, text = headline(sa, sb)
    (st.success if measurable else st.info)(text, icon=":material/compare:")
    cols = st.columns(2)
    for col, s in zip(cols, (sa, sb), strict=True):
        with col:
            st.markdown(f"**{s.label}** · {s.steps:,} steps in {s.duration_s:.2f} s")
            m = st.columns(4)
            m[0].metric("steps/s", f"{s.steps_per_s:,.1f}")
            m[1].metric("step period", f"{s.step_ms:,.3f} ms")
            m[2].metric("compute busy", f"{100 * s.busy:.1f}%",
                        help="Share of the window with a compute span (step busy).")
            m[3].metric("CPU work / step", f"{s.cpu_ms:,.3f} ms",
                        help="cpu.schedule + prepare + launch + post, median per step.")
    st.plotly_chart(ab_figure(sa, sb), key=f"{key}.figure", config={"displaylogo": False})
    longest = max(sa.duration_s, sb.duration_s) * 1000
    choices = [s for s in SPANS_MS if s <= max(longest, SPANS_MS[0])] or [SPANS_MS[0]]
    default = min(choices, key=lambda s: abs(s - min(250, longest)))
    span = st.select_slider("Timeline span shown (the last ms of each window, same scale)",
                            choices, value=default, key=f"{key}.span")
    for s, w in ((sa, a), (sb, b)):
        fig = timeline_figure(w.records, window_ms=float(span), end_ns=s.end_ns,
                              height_px=300, legend=True,
                              title=f"{s.label}: the last {span} ms of the window",
                              x_title="ms before the window's end")
        st.plotly_chart(fig, key=f"{key}.timeline.{s.label}", config={"displaylogo": False})


def pair_of(windows: Sequence[Window]) -> tuple[Window, Window] | None:
    return (windows[0], windows[1]) if len(windows) >= 2 else None
