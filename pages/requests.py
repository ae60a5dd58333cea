"""Requests page: recent requests with their status, lengths and latencies, and histograms.

Owns the presentation of the request events held on the client's telemetry bus: a table
(newest first) and histograms of time to first token, inter-token latency and end-to-end
latency. The figures come from telemetry.latency through ui.histograms.

It must never read more than the bus holds, nor keep its own copy of the events.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.latency import Distribution, request_latencies, summarize_latencies
from ui.client import engine_client, engine_errors, show_flashes
from ui.histograms import latency_histograms, request_rows

if TYPE_CHECKING:
    from engine.process.client import EngineClient

EVENTS = 65536  # the newest request events read from the bus per refresh
MAX_ROWS = 500
REFRESH_S = 2.0
AUTO_KEY = "req.auto"


def p50_p90(dist: Distribution) -> str:
    """Like "276 / 480 ms", or "3.02 / 5.61 s" past a second: short enough for a tile."""
    if dist.count == 0 or math.isnan(dist.p50):
        return "–"
    if dist.p90 >= 1e9:
        return f"{dist.p50 / 1e9:,.2f} / {dist.p90 / 1e9:,.2f} s"
    return f"{dist.p50 / 1e6:,.0f} / {dist.p90 / 1e6:,.0f} ms"


def requests_view(client: EngineClient) -> None:
    with engine_errors(client, "Reading request events"):
        events = client.telemetry().snapshot_events(EVENTS)
    lats = request_latencies(events)
    summary = summarize_latencies(lats)
    cols = st.columns(5)
    cols[0].metric("requests seen", f"{summary.requests:,}")
    cols[1].metric("finished", f"{summary.finished:,}")
    cols[2].metric("TTFT p50 / p90", p50_p90(summary.ttft))
    cols[3].metric("inter-token p50 / p90", p50_p90(summary.itl))
    cols[4].metric("end-to-end p50 / p90", p50_p90(summary.e2e))
    rows = request_rows(lats)
    if not rows:
        st.info("No requests yet: type a prompt in the Playground or start the load generator.")
        return
    st.dataframe(
        rows[:MAX_ROWS],
        key="req.table",
        hide_index=True,
        column_config={
            name: st.column_config.NumberColumn(name, format="%.1f")
            for name in ("TTFT ms", "ITL mean ms", "ITL p90 ms", "e2e ms")
        },
    )
    if len(rows) > MAX_ROWS:
        st.caption(f"Showing the newest {MAX_ROWS} of {len(rows):,} requests.")
    st.plotly_chart(latency_histograms(lats), key="req.histograms")


def main() -> None:
    client = engine_client()
    show_flashes()
    st.title("Requests")
    auto = st.toggle(
        f"Refresh every {REFRESH_S:g} s",
        value=True,
        key=AUTO_KEY,
        help="Off: the table stays still until you refresh the page.",
    )
    st.caption(
        "Latencies are measured in the engine from each request's queue entry; the table "
        "keeps what the telemetry bus still holds."
    )
    st.fragment(run_every=REFRESH_S if auto else None)(requests_view)(client)


main()
