"""The prefill tax drawn: the step-time fit with its error, ITL by step kind, device-time shares.

Owns the presentation of telemetry/prefill_tax.py's figures for the Live page and the
Recordings page: a headline sentence (what 1,000 prefill tokens add to every running request's
inter-token latency, with its 95% interval, or why the window cannot say) and one plotly figure
of three panels. Every panel says what it measures, and says so in place of the data when the
window cannot show it (too few steps, no prefill in the window). The arithmetic stays in
telemetry/prefill_tax.py. Pure functions: no streamlit, no engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from telemetry.prefill_tax import NoFit, PrefillTax, TaxFit, timed_steps
from telemetry.records import StepRecord

KIND_COLOURS = {"decode-only": "#4c78a8", "mixed": "#f58518", "prefill-only": "#b279a2"}
SHARE_COLOURS = {"decode": "#4c78a8", "prefill": "#f58518", "idle": "#bab0ac"}
PANELS = ("Step time against prefill tokens, with the fit",
          "ITL of running requests (ms)",
          "Device time")
LINE_POINTS = 50


def headline(tax: PrefillTax) -> str:
    """One markdown sentence: the tax per 1,000 prefill tokens, or why there is none."""
    fit = tax.fit
    if isinstance(fit, NoFit):
        return f"**No fit yet**: {fit.reason}."
    what = "step period (what a running request waits between tokens)" \
        if fit.source == "period" else "compute span (the device's time of a step)"
    over = f"fit of the {what} over the last {fit.steps} steps, RMSE {fit.rmse_ns / 1e6:.2f} ms"
    if tax.per_1k_ms is None:
        return f"**The prefill tax cannot be measured here**: {tax.per_1k_reason}. ({over})"
    b = tax.per_1k_ms
    return (f"**Each 1,000 prefill tokens add {b.estimate:.2f} ms** (95%: {b.lo:.2f} to "
            f"{b.hi:.2f} ms) to every running request's inter-token latency, before the "
            f"context they read ({over}).")


def _fit_line(fit: TaxFit, records: Sequence[StepRecord], window_steps: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, str] | None:
    """The fit against prefill tokens at the window's mean decode batch and decode context,
    each prefill token at the window's mean prefill context: (x, y, lo, hi) in ms, and how."""
    steps = timed_steps(records, fit.source)[-window_steps:]
    pre = [s for s in steps if s.prefill_tokens > 0]
    if not pre or not fit.has("prefill"):
        return None
    dec = [s for s in steps if s.decode_tokens > 0]
    d = float(np.mean([s.decode_tokens for s in dec])) if dec else 0.0
    dctx = float(np.mean([s.decode_context for s in dec])) if dec else 0.0
    per_tok = float(np.mean([s.prefill_context / s.prefill_tokens for s in pre]))
    x = np.linspace(0, max(s.prefill_tokens for s in pre), LINE_POINTS)
    preds = [fit.predict(d, p, dctx + p * per_tok) for p in x]
    how = (f"fit at {d:.0f} decode tokens, their context {dctx:.0f}, each prefill token "
           f"reading {per_tok:.0f}; band: 95% prediction interval of one step")
    return (x, np.array([q.mean_ns for q in preds]) / 1e6,
            np.array([q.lo_ns for q in preds]) / 1e6, np.array([q.hi_ns for q in preds]) / 1e6,
            how)


def _say(fig: go.Figure, col: int, text: str) -> None:
    """Text in place of a panel's data."""
    fig.add_annotation(text=text, xref=f"x{col if col > 1 else ''} domain",
                       yref=f"y{col if col > 1 else ''} domain", x=0.5, y=0.5,
                       showarrow=False, font={"size": 12, "color": "#666"}, align="center")


def _wrap(text: str, width: int = 48) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    return "<br>".join([*lines, line])


def prefill_tax_figure(tax: PrefillTax, records: Sequence[StepRecord], *,
                       height_px: int = 320) -> go.Figure:
    """Three panels: step time (ms) against prefill tokens, each step a point coloured by its
    kind, with the fit line and its 95% band; p50/p99 ITL of decode-only steps beside steps
    with a prefill chunk; the device's time on decode, on prefill and idle."""
    fig = make_subplots(rows=1, cols=3, column_widths=[0.5, 0.25, 0.25],
                        subplot_titles=PANELS, horizontal_spacing=0.08)
    fit = tax.fit
    source = fit.source if isinstance(fit, TaxFit) else "period"
    steps = timed_steps(records, source)[-tax.window_steps:]
    for kind, colour in KIND_COLOURS.items():
        mine = [s for s in steps if s.kind == kind]
        if mine:
            fig.add_trace(go.Scatter(
                x=[s.prefill_tokens for s in mine], y=[s.time_ns / 1e6 for s in mine],
                mode="markers", name=kind, marker={"color": colour, "size": 5, "opacity": 0.7},
                customdata=[[s.step, s.decode_tokens, s.context] for s in mine],
                hovertemplate="step %{customdata[0]}<br>%{x} prefill, %{customdata[1]} decode"
                              "<br>context %{customdata[2]}<br>%{y:.2f} ms<extra></extra>",
                legendgroup="kind"), row=1, col=1)
    if isinstance(fit, NoFit):
        _say(fig, 1, _wrap(f"No fit: {fit.reason}"))
    else:
        line = _fit_line(fit, records, tax.window_steps)
        if line is None:
            _say(fig, 1, _wrap(fit.left_out.get("prefill", "the prefill term was not fitted")))
        else:
            x, y, lo, hi, how = line
            fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]),
                                     y=np.concatenate([hi, lo[::-1]]), fill="toself",
                                     fillcolor="rgba(80,80,80,0.15)", line={"width": 0},
                                     name="95% band", hoverinfo="skip"), row=1, col=1)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="fit",
                                     line={"color": "#333", "width": 2},
                                     hovertemplate="%{x:.0f} prefill: %{y:.2f} ms"
                                                   "<extra>" + how + "</extra>"),
                          row=1, col=1)
    fig.update_xaxes(title_text="prefill tokens in the step", row=1, col=1)
    fig.update_yaxes(title_text="step period (ms)" if source == "period"
                     else "compute span (ms)", rangemode="tozero", row=1, col=1)

    itl = tax.itl
    groups = [("decode-only", itl.decode_only), ("with prefill", itl.with_prefill)]
    shown = [(name, d) for name, d in groups if d.count]
    for q, colour in (("p50", "#72b7b2"), ("p99", "#e45756")):
        fig.add_trace(go.Bar(x=[f"{name}<br>({d.count} steps)" for name, d in shown],
                             y=[getattr(d, q) for _, d in shown], name=q,
                             marker_color=colour, texttemplate="%{y:.1f}",
                             textposition="outside"), row=1, col=2)
    if not shown:
        _say(fig, 2, "no step with decode tokens in the window")
    elif itl.with_prefill.count == 0:
        _say(fig, 2, _wrap("no step in the window carried a prefill chunk beside decodes", 28))

    sh = tax.shares
    if sh is None:
        _say(fig, 3, _wrap("no compute span in the window", 28))
    else:
        for name, value in (("decode", sh.decode), ("prefill", sh.prefill), ("idle", sh.idle)):
            fig.add_trace(go.Bar(x=["device"], y=[100 * value], name=f"{name} time",
                                 marker_color=SHARE_COLOURS[name],
                                 texttemplate=f"{name} %{{y:.0f}}%", textposition="inside",
                                 hovertemplate=f"{name}: %{{y:.1f}}% of "
                                               f"{sh.window_ns / 1e9:.2f} s<extra></extra>"),
                          row=1, col=3)
        if isinstance(fit, NoFit) and tax.itl.with_prefill.count:
            _say(fig, 3, _wrap("mixed steps count as decode: no fit splits them", 24))
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=2)
    fig.update_yaxes(title_text="% of the window", range=[0, 100], row=1, col=3)
    fig.update_layout(barmode="group", height=height_px,
                      margin={"l": 50, "r": 10, "t": 40, "b": 40},
                      legend={"orientation": "h", "y": -0.25, "x": 0},
                      showlegend=True)
    # the shares panel stacks; the ITL panel groups
    for tr in fig.data:
        if isinstance(tr, go.Bar) and tr.xaxis == "x3":
            tr.offsetgroup = "shares"
    fig.update_layout(bargap=0.3)
    _stack_shares(fig)
    return fig


def _stack_shares(fig: go.Figure) -> None:
    """Stack the device-time bars by hand (barmode applies to the whole figure)."""
    base = 0.0
    for tr in fig.data:
        if isinstance(tr, go.Bar) and tr.xaxis == "x3":
            value = float(tr.y[0])
            tr.base = [base]
            base += value if math.isfinite(value) else 0.0


def fit_caption(tax: PrefillTax) -> str:
    """The fit's terms with their 95% intervals, and each term left out with its reason."""
    fit = tax.fit
    if isinstance(fit, NoFit):
        return (f"The fit needs more of the window: {fit.reason} ({fit.prefill_steps} of them "
                "carried a prefill chunk).")
    units = {"intercept": ("ms a step", 1e6), "decode": ("ms a decode token", 1e6),
             "prefill": ("ms per 1,000 prefill tokens", 1e3),
             "context": ("ms per 1,000,000 context tokens", 1.0)}
    parts = []
    for term in ("intercept", *fit.terms):
        ci = fit.coefficient(term)  # type: ignore[arg-type]
        if ci is None:
            continue
        unit, div = units[term]
        parts.append(f"{term} {ci.estimate / div:.3g} {unit} ({ci.lo / div:.3g} to "
                     f"{ci.hi / div:.3g})")
    out = (f"time = {' + '.join(parts)}; {fit.steps} steps, {fit.prefill_steps} with prefill, "
           f"residual RMSE {fit.rmse_ns / 1e6:.2f} ms, 95% intervals (t, {fit.dof} degrees of "
           "freedom).")
    if fit.outliers:
        out += (f" {len(fit.outliers)} steps at least twice the fit's time (outliers: a GC pause, "
                "a descheduled thread) are left out of its coefficients.")
    if fit.left_out:
        out += " Not fitted: " + "; ".join(f"{k}: {v}" for k, v in fit.left_out.items()) + "."
    return out
