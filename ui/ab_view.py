"""The A/B view: two windows of steps (two modes) side by side on one time scale.

Owns the figure comparing two WindowStats (decode tokens/s, B's bar with the verdict's 95%
interval as an error bar; step period, the CPU's share of a step, compute idle by cause)
and ``show_ab``, which the A/B page (live captures) and the Recordings page (a recording's
modes) both draw: a verdict in plain words on decode-only steps with its 95% interval
(telemetry.verdict), prefill apart, the figures, and both timelines over the same span
of milliseconds. It must never call the engine: it is handed records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
import streamlit as st
from plotly.subplots import make_subplots

from telemetry.gaps import CAUSE_LABELS, CAUSES
from telemetry.records import StepRecord
from telemetry.verdict import Interval, decode_steps, decode_verdict, pooled, signed
from ui.timeline import timeline_figure
from ui.window_stats import WindowStats, window_stats

COLOURS = ("#6baed6", "#fd8d3c")
# Idle causes (telemetry.gaps) in the colours the Live page's waterfall and timeline give them.
CAUSE_COLOURS: dict[str, str] = {"cpu": "#2171b5", "graph_launch": "#a1d99b", "h2d": "#fd8d3c",
                                 "previous_step": "#e6550d", "no_work": "#bdbdbd"}
SPANS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2000, 5000)


@dataclass(slots=True)
class Window:
    """A window of steps to compare: a live capture or one mode of a recording.

    ``records`` is the window drawn (figures, timeline); ``runs``, when given, are every
    alternated capture of this side (``records`` among them), which the verdict judges.
    """

    label: str
    records: list[StepRecord]
    start_ns: int | None = None
    end_ns: int | None = None
    runs: list[list[StepRecord]] = field(default_factory=list)

    def all_runs(self) -> list[list[StepRecord]]:
        return self.runs or [self.records]


def interval_whisker(rate_b: float, tput: Interval | None) -> dict | None:
    """B's decode-rate bar's error bar from the verdict's 95% interval of B over A (in %):
    the rates B may have against A by that interval, scaled about B's own bar so the bar's
    top is always inside (the alternated pairs' estimate is a mean of ratios, not quite the
    pooled rates' ratio). None without an interval."""
    if tput is None or not np.isfinite(rate_b) or tput.estimate <= -100:
        return None
    unit = rate_b / (1 + tput.estimate / 100)
    lo, hi = unit * (1 + tput.lo / 100), unit * (1 + tput.hi / 100)
    return {"type": "data", "symmetric": False, "array": [max(0.0, hi - rate_b)],
            "arrayminus": [max(0.0, rate_b - lo)], "color": "#333", "thickness": 1.5,
            "width": 8}


def ab_figure(a: WindowStats, b: WindowStats, decode_tps: tuple[float, float],
              height_px: int = 260, tput: Interval | None = None) -> go.Figure:
    """The four panels side by side; ``tput`` (the verdict's throughput interval) puts its
    95% interval on B's decode-rate bar."""
    titles = ("decode tokens/s" + (" · 95% interval" if tput else ""), "step period (ms)",
              "CPU work per step (% of a step)",
              "compute idle by cause (ms per s, all steps drawn)")
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.07)
    whisker = interval_whisker(decode_tps[1], tput)
    for side, (s, colour, tps) in enumerate(zip((a, b), COLOURS, decode_tps, strict=True)):
        hover = "%{y:,.1f} decode tokens/s (decode-only steps)"
        if side == 1 and whisker is not None and tput is not None:
            hover += (f"<br>vs {a.label}: {signed(tput.estimate, '%')}, 95% interval "
                      f"{signed(tput.lo, '%')} to {signed(tput.hi, '%')}")
        fig.add_trace(go.Bar(
            x=[s.label], y=[tps], marker_color=colour,
            error_y=whisker if side == 1 else None,
            hovertemplate=hover + "<extra></extra>", showlegend=False), 1, 1)
        fig.add_trace(go.Bar(x=[s.label], y=[s.step_ms], marker_color=colour, showlegend=False,
                             hovertemplate="%{y:,.3f} ms<extra></extra>"), 1, 2)
        fig.add_trace(go.Bar(x=[s.label], y=[100 * s.cpu_share], marker_color=colour,
                             showlegend=False, hovertemplate="%{y:.1f}%<extra></extra>"), 1, 3)
    for cause in CAUSES:
        label = CAUSE_LABELS[cause]
        fig.add_trace(go.Bar(
            x=[a.label, b.label],
            y=[s.idle_by_cause_ms.get(cause, 0.0) / s.duration_s for s in (a, b)],
            name=label, marker_color=CAUSE_COLOURS[cause], legendgroup="idle",
            hovertemplate=f"{label}: %{{y:,.1f}} ms per s<extra></extra>"), 1, 4)
    fig.update_layout(barmode="stack", height=height_px,
                      margin={"l": 30, "r": 10, "t": 40, "b": 60},
                      legend={"orientation": "h", "y": -0.18, "x": 0.76, "xanchor": "left",
                              "font": {"size": 10}, "traceorder": "normal"})
    fig.update_annotations(font_size=12)
    fig.update_yaxes(ticksuffix=" ms", row=1, col=2)
    fig.update_yaxes(ticksuffix="%", row=1, col=3)
    return fig


DRAWN = "the window drawn"


def judged_scope(captures: int) -> str:
    """Which steps the verdict and the decode figures read: every alternated capture."""
    return DRAWN if captures <= 1 else f"all {captures} captures"


def side_header(s: WindowStats, decode_steps_n: int, captures: int) -> str:
    """A side's header: the window drawn, and the decode-only steps judged, each counted
    over what it covers (the drawn window's steps are one capture's, the decode-only steps
    every capture's)."""
    head = f"**{s.label}** · {s.steps:,} steps in {s.duration_s:.2f} s"
    if captures <= 1:
        return f"{head}, {decode_steps_n:,} of them decode-only"
    return (f"{head} (the last capture, drawn) · {decode_steps_n:,} decode-only steps in "
            f"all {captures} captures, judged")


def short_ms(ms: float) -> str:
    """A duration for a metric tile: four significant figures at most ("0.386 ms",
    "32.28 ms", "126.1 ms", "1,234 ms"); "126.056 ms" was cut to "126.056 ..." in a tile a
    quarter of half the page wide."""
    if not np.isfinite(ms):
        return "–"
    digits = 3 if abs(ms) < 10 else 2 if abs(ms) < 100 else 1 if abs(ms) < 1000 else 0
    return f"{ms:,.{digits}f} ms"


def cpu_note(a: WindowStats, b: WindowStats) -> str:
    """What async could gain at most here: the CPU's own share of a step."""
    note = (
        f"The CPU's own work is {100 * a.cpu_share:.1f}% of a step in {a.label} and "
        f"{100 * b.cpu_share:.1f}% in {b.label}: overlapping it with the device (async) can "
        f"save at most about that share of each step."
    )
    if max(a.cpu_share, b.cpu_share) < 0.05:
        note += " Here it is small, so the device's time decides and the modes look alike."
    return note


def show_ab(a: Window, b: Window, *, key: str, judge: bool = True) -> None:
    """Verdict, figures side by side, and both timelines over one span of milliseconds.
    ``judge=False`` leaves the verdict out (one window shown twice has nothing to judge)."""
    try:
        sa = window_stats(a.records, a.label, a.start_ns, a.end_ns)
        sb = window_stats(b.records, b.label, b.start_ns, b.end_ns)
    except ValueError as exc:
        st.error(f"Cannot compare: {exc}")
        return
    tput = None
    if judge:
        v = decode_verdict(a.all_runs(), b.all_runs(), a_label=a.label, b_label=b.label)
        (st.success if v.measurable else st.info)(v.text, icon=":material/compare:")
        st.caption(cpu_note(sa, sb))
        tput = v.throughput
    decode = [[decode_steps(r) for r in w.all_runs()] for w in (a, b)]
    cols = st.columns(2)
    tps = []
    for col, s, runs in zip(cols, (sa, sb), decode, strict=True):
        n = sum(r.n for r in runs)
        rate, busy = pooled(runs)
        tps.append(rate)
        judged = judged_scope(len(runs))
        with col:
            st.markdown(side_header(s, n, len(runs)))
            # Two by two: four tiles in half a 1280 px page cut "23.43 ms" to "23.43...".
            m = [c for _ in range(2) for c in st.columns(2)]
            m[0].metric("decode tokens/s", f"{rate:,.1f}",
                        help=f"Decode-only steps of {judged}: their tokens over their "
                        "periods.")
            m[1].metric("step period", short_ms(s.step_ms),
                        help=f"Median step period of {DRAWN}: {s.step_ms:,.3f} ms.")
            m[2].metric("compute busy (decode)", f"{100 * busy:.1f}%",
                        help=f"Share of the decode-only steps' time with a compute span "
                        f"(step busy), over {judged}; prefill steps are left out. The idle "
                        f"by cause chart below covers every step of {DRAWN}.")
            m[3].metric("CPU work / step", short_ms(s.cpu_ms),
                        help=f"cpu.schedule + prepare + launch + post, median per step of "
                        f"{DRAWN}.")
    st.plotly_chart(ab_figure(sa, sb, (tps[0], tps[1]), tput=tput), key=f"{key}.figure",
                    config={"displaylogo": False})
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
