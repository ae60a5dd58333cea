"""Requests page: recent requests with their status, lengths and latencies, histograms, and
the request ledger.

Owns the presentation of the request events and steps held on the client's telemetry bus:
counts (finished apart from aborted), a table (newest first), histograms of time to first
token, inter-token latency and end-to-end latency (telemetry.latency through ui.figures.histograms),
and the ledger (telemetry.ledger through ui.figures.ledger_table): per finished request, slowest
first, its queue time, steps, token share of their device time, KV read, cached tokens and
preemptions, with a button that opens the Live timeline paused on a window around its
steps, its own steps lit and the others faded.

It must never read more than the bus holds, nor keep its own copy of the events.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.latency import Distribution, request_latencies, summarize_latencies
from telemetry.ledger import build_ledger, slowest_first
from ui.engine_link import engine_client, engine_errors
from ui.figures.histograms import latency_histograms, request_rows
from ui.figures.ledger_table import LIVE_URL_PATH, ledger_rows, outcome_counts, timeline_state
from ui.widgets.fragments import live_fragment, run_page

if TYPE_CHECKING:
    from engine.process.client import EngineClient

EVENTS = 65536  # the newest request events read from the bus per refresh
STEPS = 1 << 20  # every step the bus still holds (its ring is smaller)
PICK_KEY = "req.ledger_pick"
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


def requests_view(client: EngineClient, kv_bytes_per_token: int) -> None:
    with engine_errors(client, "Reading request events"):
        bus = client.telemetry()
        events = bus.snapshot_events(EVENTS)
        records = bus.snapshot_steps(STEPS)
    lats = request_latencies(events)
    summary = summarize_latencies(lats)
    finished, aborted = outcome_counts(lat.finish_reason for lat in lats.values())
    # Two rows of three: six tiles in a row cut "0.26 / 1.21 s" to "0.26 / 1.2..." at 1280.
    cols = [c for _ in range(2) for c in st.columns(3)]
    cols[0].metric("requests seen", f"{summary.requests:,}")
    cols[1].metric("finished", f"{finished:,}", help="Ended on their own (stop, length, error, "
                   "engine death); aborted requests are counted apart.")
    cols[2].metric("aborted", f"{aborted:,}")
    cols[3].metric("TTFT p50 / p90", p50_p90(summary.ttft))
    cols[4].metric("inter-token p50 / p90", p50_p90(summary.itl))
    cols[5].metric("end-to-end p50 / p90", p50_p90(summary.e2e))
    rows = request_rows(lats)
    if not rows:
        st.info("No requests yet: type a prompt in the Playground or start the load generator.")
        return
    st.dataframe(
        rows[:MAX_ROWS],
        key="req.table",
        hide_index=True,
        placeholder="–",  # not known yet (a request still running has no e2e)
        column_config={
            name: st.column_config.NumberColumn(name, format="%.1f")
            for name in ("TTFT ms", "ITL mean ms", "ITL p90 ms", "e2e ms")
        },
    )
    if len(rows) > MAX_ROWS:
        st.caption(f"Showing the newest {MAX_ROWS} of {len(rows):,} requests.")
    st.plotly_chart(latency_histograms(lats), key="req.histograms")
    ledger_view(records, events, kv_bytes_per_token, slowest_ids(lats.values(), MAX_ROWS))


def slowest_ids(lats, n: int) -> set[str]:
    """The ``n`` slowest finished requests by their events alone: the ledger then joins only
    them to the steps (a chunk per request per step is a million at batch 256)."""
    done = [lat for lat in lats if lat.finish_reason is not None]
    done.sort(key=lambda lat: -(lat.e2e_ns if lat.e2e_ns is not None else -1))
    return {lat.request_id for lat in done[:n]}


def ledger_view(records: list, events: list, kv_bytes_per_token: int, ids: set[str]) -> None:
    st.subheader("Request ledger, slowest first")
    st.caption(
        "Per finished request, joined to the steps it rode: its share of each step's device "
        "time is its share of the step's tokens; KV read counts its whole context at every "
        "step. 'partial': its first steps are no longer on the bus."
    )
    slow = slowest_first(build_ledger(records, events, kv_bytes_per_token, only=ids).values())
    if not slow:
        st.info("No finished request on the bus yet.")
        return
    shown = slow[:MAX_ROWS]
    st.dataframe(
        ledger_rows(shown),
        key="req.ledger",
        hide_index=True,
        placeholder="–",
        column_config={
            name: st.column_config.NumberColumn(name, format="%.2f")
            for name in ("e2e ms", "queue ms", "TTFT ms", "device ms", "KV read MiB")
        },
    )
    pick_col, go_col = st.columns([3, 2], vertical_alignment="bottom")
    ids = [e.request_id for e in shown]
    rid = pick_col.selectbox("Request", ids, key=PICK_KEY)
    if go_col.button("Show its steps on the Live timeline", key="req.to_timeline",
                     icon=":material/timeline:", disabled=rid is None):
        entry = next(e for e in shown if e.request_id == rid)
        for key, value in timeline_state(entry, records).items():
            st.session_state[key] = value
        st.switch_page(st.Page(lambda: None, title="Live", url_path=LIVE_URL_PATH))


def main() -> None:
    client = engine_client()
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
    with engine_errors(client, "Reading the engine's settings"):
        per_token = int(client.settings().get("kv_bytes_per_token", 0))
    live_fragment(requests_view, REFRESH_S if auto else None)(client, per_token)


run_page(main)
