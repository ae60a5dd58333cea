"""The Requests page's table rows and latency histograms (TTFT, inter-token, end-to-end).

Owns the presentation of telemetry.latency's per-request figures: a status word per
request, rows in milliseconds, and one plotly figure with three histograms. The latency
arithmetic stays in telemetry/latency.py. Pure functions: no streamlit, no engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from telemetry.latency import RequestLatency

HISTOGRAMS: tuple[tuple[str, str], ...] = (
    ("ttft", "time to first token (ms)"),
    ("itl", "inter-token latency (ms)"),
    ("e2e", "end-to-end latency (ms)"),
)


def request_status(lat: RequestLatency) -> str:
    """ "waiting" (not scheduled yet), "running", or the finish reason ("stop", "length"...)."""
    if lat.finish_reason is not None:
        return lat.finish_reason
    if lat.queue_ns is None and lat.ttft_ns is None:
        return "waiting"
    return "running"


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def request_rows(
    latencies: Mapping[str, RequestLatency], newest_first: bool = True
) -> list[dict[str, Any]]:
    """One table row per request, latencies in ms (None where not known yet).

    Order is the order of ``latencies`` (the order the requests were first seen), reversed
    with ``newest_first``.
    """
    rows = []
    for rid, lat in latencies.items():
        itl = lat.itl
        rows.append(
            {
                "request": rid,
                "status": request_status(lat),
                "prompt tokens": lat.prompt_tokens,
                "output tokens": lat.output_tokens,
                "TTFT ms": _ms(lat.ttft_ns),
                "ITL mean ms": _ms(itl.mean) if itl.count else None,
                "ITL p90 ms": _ms(itl.p90) if itl.count else None,
                "e2e ms": _ms(lat.e2e_ns),
            }
        )
    return rows[::-1] if newest_first else rows


def latency_samples(latencies: Mapping[str, RequestLatency]) -> dict[str, np.ndarray]:
    """Samples in ms for each histogram: TTFT and e2e per request, ITL per token."""
    lats: Sequence[RequestLatency] = list(latencies.values())
    return {
        "ttft": np.array([x.ttft_ns for x in lats if x.ttft_ns is not None], float) / 1e6,
        "itl": np.array([t for x in lats for t in x.itl_ns], float) / 1e6,
        "e2e": np.array([x.e2e_ns for x in lats if x.e2e_ns is not None], float) / 1e6,
    }


def latency_histograms(latencies: Mapping[str, RequestLatency], height_px: int = 300) -> go.Figure:
    """Three histograms side by side; each subplot title carries its sample count and p50."""
    samples = latency_samples(latencies)
    titles = []
    for key, label in HISTOGRAMS:
        arr = samples[key]
        extra = f"n={arr.size}, p50 {np.median(arr):.1f}" if arr.size else "no samples yet"
        titles.append(f"{label}<br><sup>{extra}</sup>")
    fig = make_subplots(rows=1, cols=len(HISTOGRAMS), subplot_titles=titles)
    colours = ("#3182bd", "#31a354", "#e6550d")
    for i, ((key, label), colour) in enumerate(zip(HISTOGRAMS, colours, strict=True)):
        fig.add_trace(
            go.Histogram(x=samples[key], name=label, marker={"color": colour}, nbinsx=30),
            row=1,
            col=i + 1,
        )
        fig.update_xaxes(title_text="ms", row=1, col=i + 1)
    fig.update_yaxes(title_text="count", row=1, col=1)
    fig.update_layout(
        height=height_px, showlegend=False, bargap=0.05, margin={"l": 10, "r": 10, "t": 60}
    )
    return fig
