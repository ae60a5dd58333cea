"""The A/B figures: two windows of steps (two modes) compared on one scale.

Owns the Window a side is made of, the figure comparing two WindowStats (decode tokens/s,
B's bar with the verdict's 95% interval as an error bar; step period, the CPU's share of a
step, compute idle by cause) and the words around it (each side's header, the CPU note).
ui/widgets/ab_view.py draws them. It never imports streamlit and never calls the engine:
it is handed records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from telemetry.gaps import CAUSE_LABELS, CAUSES
from telemetry.records import StepRecord
from telemetry.verdict import Interval, signed
from ui.figures.window_stats import WindowStats

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


def pair_of(windows: Sequence[Window]) -> tuple[Window, Window] | None:
    return (windows[0], windows[1]) if len(windows) >= 2 else None
