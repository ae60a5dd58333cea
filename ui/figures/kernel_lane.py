"""The kernel lane: the measured kernels of sampled steps, under the timeline's compute lane.

Owns the figure: the same x axis as the timeline (ms before the window's end), one row,
each kernel a bar in its family's colour (telemetry.kernel_family) with its name, duration
and step in the hover. Blank lane is measured idle only: inside a sample's window (whole
sampled steps and the gaps between them). Every stretch outside the samples' windows is a
pale band named "not measured" (`not_measured_spans`), and a step in the window that was not
sampled a darker pale bar over its compute span, so time the sampler did not see never reads
as idle; each step's hover carries its waterfall (ui.figures.waterfall.step_parts_text). On a
CPU the lane says in one line that there are no kernels. Pure functions: no streamlit, no
engine, no clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go

from telemetry.kernel_family import FAMILIES, colour_of
from telemetry.kernels import KernelSample
from telemetry.records import StepRecord
from ui.figures.waterfall import step_parts_text

NOT_MEASURED = "not measured"
NOT_MEASURED_COLOUR = "rgba(180,180,180,0.22)"  # outside every sample's window
NOT_SAMPLED_COLOUR = "rgba(180,180,180,0.35)"  # a step's compute span, drawn over the band
NO_KERNELS = "No kernels on a CPU: the kernel lane needs a GPU (CUDA kernels are sampled)."
NONE_IN_WINDOW = ("Kernels are recorded for a few steps every kernel_sample_period_s: no "
                  "sampled step in this window (pale: not measured, not idle).")
NOT_MEASURED_HOVER = ("<b>not measured</b>: outside the kernel sampler's windows, so no "
                      "kernel was recorded here; not idle time")


def not_measured_spans(samples: Sequence[KernelSample], lo: int, hi: int,
                       ) -> list[tuple[int, int]]:
    """The stretches of [lo, hi) (ns) outside every sample's window: time the kernel
    sampler did not measure, whatever ran in it. In start order, disjoint."""
    out, at = [], lo
    for a, b in sorted(s.window for s in samples):
        if b <= at or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


def sampler_note(stats: dict[str, Any] | None) -> str | None:
    """One line when the kernel sampler's latest samples came back without kernel records
    (the engine's stats: kernel_samples_lost_in_row, kernel_sampler_error): the lane and the
    measured figures then rest on older samples, and the page says so rather than show a
    lane that looks idle."""
    n = int((stats or {}).get("kernel_samples_lost_in_row", 0) or 0)
    if n <= 0:
        return None
    return (f"The profiler returned no kernel record for the last {n} sample"
            f"{'s' if n > 1 else ''} (CUPTI kept the runtime calls only): kernel figures "
            "come from older samples.")


def samples_of(records: Sequence[StepRecord]) -> list[KernelSample]:
    """Every kernel sample the records carry (a sample rides on a later step's record)."""
    return [s for r in records for s in r.kernel_samples]


def kernel_lane_figure(records: Sequence[StepRecord], samples: Sequence[KernelSample], *,
                       end_ns: int, window_ms: float, device: str = "cuda",
                       height_px: int = 120, width_px: int = 1600,
                       sampled_records: Sequence[StepRecord] = (),
                       stats: dict[str, Any] | None = None) -> go.Figure:
    """The lane for the window [end_ns - window_ms, end_ns] (x: ms before end_ns).
    ``sampled_records``: the sampled steps' records kept across refreshes (for the hover's
    kernel time of unsampled steps); ``stats``: the engine's, for `sampler_note`."""
    lo = end_ns - int(window_ms * 1e6)
    px_ns = max(end_ns - lo, 1) / width_px
    by_step = {st.step: st for s in samples for st in s.steps}
    fig = go.Figure()
    pale_x, pale_base, pale_text = [], [], []
    sampled_steps = 0
    per_family: dict[str, tuple[list[float], list[float], list[str]]] = {
        f: ([], [], []) for f in FAMILIES}
    # No kernels off a GPU: the lane only says so (per-step hovers would cost each refresh a
    # pass over every step in the window, for nothing to show).
    index = {r.step: r for r in records}
    for rec in records if device == "cuda" else ():
        comp = [s for s in rec.spans if s.lane == "compute"]
        if not comp or comp[0].end_ns < lo or comp[0].start_ns > end_ns:
            continue
        c = comp[0]
        parts = step_parts_text(rec, records, samples, index, sampled_records)
        st = by_step.get(rec.step)
        if st is None:
            pale_base.append((c.start_ns - end_ns) / 1e6)
            pale_x.append(max(c.duration_ns, px_ns) / 1e6)
            pale_text.append(f"<b>step {rec.step}: not measured</b> (not sampled)<br>{parts}")
            continue
        sampled_steps += 1
        for k in st.kernels:
            if k.end_ns < lo or k.start_ns > end_ns:
                continue
            xs, bases, texts = per_family.setdefault(k.family, ([], [], []))
            bases.append((k.start_ns - end_ns) / 1e6)
            xs.append(max(k.duration_ns, px_ns) / 1e6)
            texts.append(f"<b>{k.family}</b> {k.duration_ns / 1e3:.2f} us<br>{k.name[:120]}"
                         f"<br>step {rec.step}<br>{parts}")
    gaps = not_measured_spans(samples, lo, end_ns) if device == "cuda" else []
    if gaps:
        fig.add_trace(go.Bar(orientation="h", y=np.zeros(len(gaps)),
                             base=[(a - end_ns) / 1e6 for a, _ in gaps],
                             x=[max(b - a, px_ns) / 1e6 for a, b in gaps], name=NOT_MEASURED,
                             legendgroup=NOT_MEASURED,
                             marker={"color": NOT_MEASURED_COLOUR, "line": {"width": 0}},
                             hovertext=np.array([NOT_MEASURED_HOVER] * len(gaps), dtype=str),
                             hoverinfo="text"))
    if pale_x:
        fig.add_trace(go.Bar(orientation="h", y=np.zeros(len(pale_x)), base=pale_base,
                             x=pale_x, name=NOT_MEASURED, legendgroup=NOT_MEASURED,
                             showlegend=not gaps,
                             marker={"color": NOT_SAMPLED_COLOUR, "line": {"width": 0}},
                             hovertext=np.array(pale_text, dtype=str), hoverinfo="text"))
    for family, (xs, bases, texts) in per_family.items():
        if xs:
            fig.add_trace(go.Bar(orientation="h", y=np.zeros(len(xs)), base=bases, x=xs,
                                 name=family, marker={"color": colour_of(family),
                                                      "line": {"width": 0}},
                                 hovertext=np.array(texts, dtype=str), hoverinfo="text"))
    note = None
    if device != "cuda":
        note = NO_KERNELS
    else:
        note = sampler_note(stats) or (None if sampled_steps else NONE_IN_WINDOW)
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font={"size": 12})
    fig.update_layout(
        barmode="overlay", bargap=0.3, height=height_px,
        margin={"l": 10, "r": 10, "t": 28, "b": 24},
        title={"text": f"kernels (measured, {sampled_steps} sampled steps)",
               "font": {"size": 13}, "x": 0.01},
        xaxis={"range": [-float(window_ms), 0.0], "ticksuffix": " ms", "zeroline": False},
        yaxis={"tickmode": "array", "tickvals": [0.0], "ticktext": ["kernels (sampled)"],
               "fixedrange": True, "range": [0.5, -0.5], "automargin": True},
        # One row under the axis: a legend column beside a lane this short needs its own
        # scroll bar.
        legend={"font": {"size": 10}, "orientation": "h", "yanchor": "top", "y": -0.35,
                "x": 0, "traceorder": "normal"}, hovermode="closest")
    return fig
