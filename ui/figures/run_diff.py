"""The Diff page's figures: two runs' step times, waterfalls and kernel families side by side.

Owns the drawing of a telemetry.run_diff.RunDiff: step-time distributions as boxes by batch
size (decode-only steps and steps with a prefill chunk in two panels, A and B side by side,
each batch's change of the median and its 95% interval under it), the floor-to-wall
waterfall per step as two stacked bars, kernel-family time per sampled step as two stacked
bars, and the table of the groups. The arithmetic is telemetry.run_diff's, the interval
telemetry.verdict's, the waterfall's colours ui/figures/waterfall.py's, the families'
telemetry.kernel_family's. Pure: no streamlit, no engine, no clock reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from telemetry.kernel_family import FAMILIES, colour_of
from telemetry.run_diff import (
    DECODE_ONLY,
    KINDS,
    WITH_PREFILL,
    FamilyTime,
    GroupDiff,
    RunDiff,
    WaterfallPerStep,
    label_order,
)
from telemetry.verdict import Interval, signed
from telemetry.waterfall import LABELS, UNSPLIT
from ui.figures.ab import COLOURS as SIDE_COLOURS
from ui.figures.waterfall import COLOURS as PART_COLOURS

KIND_TITLES = {DECODE_ONLY: "decode-only steps", WITH_PREFILL: "steps with a prefill chunk"}
UNSPLIT_LABEL = "step busy (no kernel samples to split it)"
UNSPLIT_COLOUR = "#74c476"
LOG_SPREAD = 20.0  # step times spread wider than this ratio get a log axis
SCALE_APART = 5.0  # sides whose step differs more than this are drawn in % of a step
ALL_POINTS = 3000  # a side's panel with more steps than this draws its outliers only


def interval_text(change: Interval | None) -> str:
    """A group's change of the median with its 95% interval, short: "−26% (−28 to −20)"."""
    if change is None:
        return "too few"
    return (f"{signed(change.estimate, '%')} ({signed(change.lo, '')} to "
            f"{signed(change.hi, '%')})").replace(".0%", "%")


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2 and 5 times each power of ten from below ``lo`` to above ``hi``."""
    out = []
    for k in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1):
        out += [m * 10.0 ** k for m in (1, 2, 5)]
    below = [t for t in out if t <= lo]
    above = [t for t in out if t >= hi]
    first = below[-1] if below else out[0]
    last = above[0] if above else out[-1]
    return [round(t, 12) for t in out if first <= t <= last]


def side_names(diff: RunDiff) -> tuple[str, str]:
    return f"A: {diff.a.label}", f"B: {diff.b.label}"


def step_time_figure(diff: RunDiff, height_px: int = 340) -> go.Figure:
    """Boxes of step time (ms) by batch size, A and B side by side, one panel per step kind
    that either run has. Under each batch: B's median against A's with its 95% interval."""
    kinds = [k for k in KINDS if any(g.kind == k for g in diff.groups)] or [DECODE_ONLY]
    widths = [max(1, sum(g.kind == k for g in diff.groups)) for k in kinds]
    fig = make_subplots(rows=1, cols=len(kinds), column_widths=[w / sum(widths) for w in widths],
                        subplot_titles=[KIND_TITLES[k] for k in kinds],
                        horizontal_spacing=0.08 if len(kinds) > 1 else 0.0)
    values = np.concatenate([np.concatenate([g.a_ms, g.b_ms]) for g in diff.groups]
                            or [np.empty(0)])
    values = values[values > 0]
    log = values.size > 0 and values.max() / values.min() > LOG_SPREAD
    names = side_names(diff)
    for col, kind in enumerate(kinds, start=1):
        groups = sorted((g for g in diff.groups if g.kind == kind),
                        key=lambda g: label_order(g.batch))
        for side, name in enumerate(names):
            xs: list[str] = []
            ys: list[float] = []
            for g in groups:
                ms = g.a_ms if side == 0 else g.b_ms
                xs += [g.batch] * int(ms.size)
                ys += [float(v) for v in ms]
            fig.add_trace(go.Box(
                x=xs, y=ys, name=name, offsetgroup=str(side), legendgroup=str(side),
                showlegend=col == 1,
                marker={"color": SIDE_COLOURS[side], "size": 3, "opacity": 0.6},
                line={"width": 1.2}, boxpoints="all" if len(ys) <= ALL_POINTS else "outliers",
                jitter=0.4, pointpos=0,
                hovertemplate=f"{name}<br>batch %{{x}}: %{{y:,.3f}} ms<extra></extra>"),
                1, col)
        ticks = [g.batch for g in groups]
        text = [f"batch {g.batch}<br>{interval_text(g.verdict.change)}" if g.shared
                else f"batch {g.batch}<br>{'A' if g.a_ms.size else 'B'} only" for g in groups]
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=ticks,
                         tickvals=ticks, ticktext=text, tickfont={"size": 11}, row=1, col=col)
    fig.update_yaxes(title_text="step time (ms)" + (", log" if log else ""), row=1, col=1)
    if log:  # 1-2-5 ticks: Plotly's own minor log labels read "5 2 100 5 2"
        ticks = log_ticks(float(values.min()), float(values.max()))
        fig.update_yaxes(type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_layout(
        boxmode="group", height=height_px, margin={"l": 60, "r": 10, "t": 30, "b": 70},
        legend={"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right", "yanchor": "bottom",
                "font": {"size": 11}})
    fig.update_annotations(font_size=12)
    return fig


def _stacked_bars(fig: go.Figure, names: tuple[str, str],
                  parts: Sequence[tuple[str, str, str, tuple[float, float]]],
                  unit: str, totals: tuple[float, float]) -> None:
    """One horizontal bar per side (B above A: read top down), a trace per part:
    (key, label, colour, (A's value, B's value))."""
    for _key, label, colour, vals in parts:
        if not any(v > 0 for v in vals):
            continue
        hover = [f"<b>{label}</b><br>{n}: {v:,.3f} {unit} ({100 * v / t:.1f}%)" if t else ""
                 for n, v, t in zip(names, vals, totals, strict=True)]
        fig.add_trace(go.Bar(orientation="h", y=list(names), x=list(vals), name=label,
                             marker={"color": colour, "line": {"width": 0}},
                             hovertext=hover, hoverinfo="text"))


def waterfall_figure(diff: RunDiff, height_px: int = 210) -> go.Figure:
    """Each run's window split floor to wall (telemetry.waterfall), per step, as two stacked
    bars: in ms per step, or in % of a step where the two runs' steps are far apart (two
    devices)."""
    names = side_names(diff)
    wa, wb = diff.waterfalls
    sides = (wa, wb)
    steps = [w.step_ms if w is not None else float("nan") for w in sides]
    apart = all(np.isfinite(steps)) and max(steps) / min(steps) > SCALE_APART
    keys: list[str] = []
    for w in sides:
        for k in (w.parts_ms if w is not None else {}):
            if k not in keys:
                keys.append(k)
    order = [UNSPLIT, *LABELS]
    keys.sort(key=order.index)

    def value(w: WaterfallPerStep | None, k: str) -> float:
        if w is None:
            return 0.0
        v = w.parts_ms.get(k, 0.0)
        return 100 * v / w.step_ms if apart and w.step_ms else v

    unit = "% of a step" if apart else "ms per step"
    parts = [(k, UNSPLIT_LABEL if k == UNSPLIT else LABELS[k],
              UNSPLIT_COLOUR if k == UNSPLIT else PART_COLOURS[k],
              (value(wa, k), value(wb, k))) for k in keys]
    totals = (sum(p[3][0] for p in parts), sum(p[3][1] for p in parts))
    fig = go.Figure()
    _stacked_bars(fig, names, parts, "%" if apart else "ms", totals)
    per_step = " · ".join(f"{n.split(':')[0]} {s:,.3f} ms a step" for n, s in
                          zip(names, steps, strict=True) if np.isfinite(s))
    fig.update_layout(
        barmode="stack", height=height_px, margin={"l": 10, "r": 10, "t": 30, "b": 20},
        title={"text": f"Where a step's time went, floor to wall ({unit}; {per_step})",
               "font": {"size": 13}, "x": 0.01},
        xaxis={"ticksuffix": "%" if apart else " ms"},
        yaxis={"autorange": "reversed", "automargin": True},
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "x": 0, "font": {"size": 10},
                "traceorder": "normal"})
    return fig


def family_figure(diff: RunDiff, height_px: int = 190) -> go.Figure | None:
    """Kernel time per sampled step by family, one stacked bar per run, the families in
    their shared colours; None unless both runs carry kernel samples."""
    fa, fb = diff.families
    if fa is None or fb is None:
        return None
    names = side_names(diff)

    def us(f: FamilyTime, fam: str) -> float:
        return f.us_per_step.get(fam, 0.0)

    parts = [(fam, fam, colour_of(fam), (us(fa, fam), us(fb, fam))) for fam in FAMILIES]
    totals = (sum(fa.us_per_step.values()), sum(fb.us_per_step.values()))
    fig = go.Figure()
    _stacked_bars(fig, names, parts, "us", totals)
    fig.update_layout(
        barmode="stack", height=height_px, margin={"l": 10, "r": 10, "t": 30, "b": 20},
        title={"text": f"Kernel time per sampled step by family (us; {fa.sampled_steps} and "
                       f"{fb.sampled_steps} sampled steps)", "font": {"size": 13}, "x": 0.01},
        xaxis={"ticksuffix": " us"}, yaxis={"autorange": "reversed", "automargin": True},
        legend={"orientation": "h", "yanchor": "top", "y": -0.25, "x": 0, "font": {"size": 10},
                "traceorder": "normal"})
    return fig


def family_note(diff: RunDiff) -> str:
    """Why kernel families are not drawn: which run carries no kernel samples."""
    missing = [n for n, f in zip(side_names(diff), diff.families, strict=True) if f is None]
    if not missing:
        return ""
    where = "either run" if len(missing) == 2 else missing[0]
    return (f"Kernel families: no kernel samples in {where}. They come from "
            "the kernel sampler on a GPU (telemetry/kernels.py); a CPU run, or a recording "
            "made without the sampler, has none, so kernel time by family is not compared.")


def group_rows(groups: Sequence[GroupDiff]) -> list[dict]:
    """The table under the boxes: one row per (kind, batch) group."""
    rows = []
    for g in groups:
        c = g.verdict.change
        rows.append({
            "kind": g.kind, "batch": g.batch,
            "A steps": int(g.a_ms.size),
            "A median ms": round(float(np.median(g.a_ms)), 3) if g.a_ms.size else None,
            "B steps": int(g.b_ms.size),
            "B median ms": round(float(np.median(g.b_ms)), 3) if g.b_ms.size else None,
            "B vs A": signed(c.estimate, "%") if c else "",
            "95% interval": f"{signed(c.lo, '%')} to {signed(c.hi, '%')}" if c else "",
            "verdict": g.verdict.kind if g.shared else "one run only",
        })
    return rows


def facet_rows(diff: RunDiff) -> list[dict]:
    """The runs' facts side by side, with whether they match."""
    return [{"": f.name, "A": f.a or "unknown", "B": f.b or "unknown",
             "same": "yes" if f.same else "no" if f.known else "?"} for f in diff.facets]
