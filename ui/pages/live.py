"""Live page: where every CPU and device microsecond of the running engine goes, as it runs.

Owns one row of the controls that act on the running engine (async, slots, graphs, load
on/off), then a row of history sparklines and the step timeline, all visible without
scrolling, updated in place once a second (ui/widgets/live_plot.py keeps one Plotly div, so
zoom, pan and hover survive), then the kernel lane and the waterfall, the
pause and Chrome trace download, the load generator's parameters and the gauges. Figures come
from ui/figures/ (pure functions); the engine is reached only through ui/engine_link.py's
shared client.

app.py imports ``live_page`` and lists the function, where the other pages are listed by
file: the banner app.py draws first then stays in the same element tree as the page, which
Streamlit's AppTest (tests/ui) shows only for a function page.

It must never draw from a thread other than the script's, and never rebuild the timeline
faster than once a second (Plotly work here competes for the CPU with the engine's prep).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.export import chrome_trace_json
from telemetry.records import StepRecord
from ui.engine_link import current_settings, engine_client, engine_errors, engine_status
from ui.figures.gauges import (
    LiveWindow,
    gauge_values,
    gauges_figure,
    keep_samples,
    live_window,
    steps_in_flight,
    window_busy,
)
from ui.figures.history import LiveHistory, history_figure, memory_bandwidth_reason
from ui.figures.kernel_lane import kernel_lane_figure, samples_of
from ui.figures.lanes import ASYNC_NOTE
from ui.figures.timeline import recent_window, timeline_figure, window_end_ns
from ui.figures.waterfall import waterfall_figure
from ui.widgets.controls import engine_controls, load_generator, load_switch
from ui.widgets.fragments import live_fragment, run_page
from ui.widgets.live_plot import live_plot
from ui.widgets.prefill_tax import prefill_tax_live
from ui.widgets.token_budget import PANEL_PERIOD_S as BUDGET_PERIOD_S
from ui.widgets.token_budget import token_budget_panel

if TYPE_CHECKING:
    from engine.process.client import EngineClient

LIVE_PERIOD_S = 1.0  # history and timeline: 1 Hz, the most docs/design.md §7 allows
CONTROLS_PERIOD_S = 1.0  # controls follow the engine's settings (changed from anywhere)
GAUGE_WINDOW_MS = 2000.0
TIMELINE_WINDOWS_MS = (50, 100, 250, 500, 1000, 2000, 5000)
DEFAULT_WINDOW_MS = 1000  # a few CPU steps, a few hundred GPU steps
TRACE_EVENTS = 65536  # request events looked through for the steps' requests
SNAPSHOT_STEPS = 4000  # the newest steps taken from the bus per refresh (a slice, no copy)
TIMELINE_WIDTH_PX = 1600  # for merging sub-pixel spans; about a wide browser window
HISTORY_HEIGHT_PX = 150
TIMELINE_HEIGHT_PX = 380
KERNEL_LANE_HEIGHT_PX = 150
WATERFALL_HEIGHT_PX = 170
GAUGES_HEIGHT_PX = 440
SAMPLE_SCAN_STEPS = 1000  # kernel samples ride on later records: look a little further back

PAUSE_KEY = "live.pause"
FROZEN_KEY = "live.frozen"
WINDOW_KEY = "live.window_ms"
LAST_KEY = "live.last_records"
SHOWN_KEY = "live.shown"  # the paused steps: drawn, and in the trace download
HIGHLIGHT_KEY = "live.highlight"  # {"request", "steps"}: a request's steps, from Requests


@st.cache_resource
def live_history() -> LiveHistory:
    """One history per server: every tab draws the same buckets (read with one cursor)."""
    return LiveHistory()


def device_notice(settings: dict, client: EngineClient) -> None:
    """Say plainly when there is no GPU, and what that changes on this page."""
    if settings.get("device") == "cuda":
        return
    reason = (client.nvml_reason() or "NVML is not available").removeprefix("no GPU: ")
    st.caption(
        f":material/memory: **No GPU** ({reason}). The engine runs on the CPU; the h2d, "
        "compute and d2h lanes are the same pipeline with each stream emulated by a worker "
        "thread, so sync and async still differ. CUDA graphs, NVML and memory bandwidth need "
        "a GPU."
    )


def gauge_window(records: list[StepRecord], stats: dict, now_ns: int) -> LiveWindow:
    """The gauges' window: the last GAUGE_WINDOW_MS, a step still in flight (or on the wire)
    busy in it. The history strip's step busy figure reads the same window."""
    tail = records[-16:]
    return live_window(tail, now_ns, GAUGE_WINDOW_MS, in_flight=steps_in_flight(tail, stats))


def draw_history(client: EngineClient, settings: dict, records: list[StepRecord]) -> dict:
    """The history strip; returns the engine's stats it read (the kernel lane reads them too)."""
    history = live_history()
    nvml = client.nvml()
    now = time.perf_counter_ns()
    history.update(client.telemetry(), nvml, now)
    stats = client.stats()
    window = gauge_window(records, stats, now)
    series = history.series(now, stats=stats, in_flight=window.in_flight_from_ns is not None)
    recent = recent_window(records, GAUGE_WINDOW_MS, end_ns=window.end_ns) if records else []
    series.busy_now_pct = 100 * window_busy(recent, window)
    series.mem_bw_reason = memory_bandwidth_reason(nvml, client.nvml_reason(),
                                                   settings.get("device", "cuda"))
    series.max_num_seqs = int(settings.get("max_num_seqs", 0))
    live_plot(history_figure(series, HISTORY_HEIGHT_PX), key="live.history",
              height_px=HISTORY_HEIGHT_PX)
    return stats


def draw_timeline(records: list[StepRecord], window_ms: float, paused: bool) -> list[StepRecord]:
    """Draw the timeline of the newest ``window_ms``; returns the steps it shows. Paused on
    a request from the Requests page, that request's steps are drawn lit, the rest faded."""
    recent = recent_window(records, window_ms) if records else []
    state = "Paused" if paused else "Live"
    lit = st.session_state.get(HIGHLIGHT_KEY) if paused else None
    if lit:
        note = f" · request {lit['request']}'s {len(lit['steps'])} steps lit, the rest faded"
    else:
        note = " (zoom and pan freely)" if paused else " (zoom, pan and hover stay while live)"
    fig = timeline_figure(
        recent,
        window_ms=window_ms,
        width_px=TIMELINE_WIDTH_PX,
        height_px=TIMELINE_HEIGHT_PX,
        uirevision="live.timeline",
        title=f"{state}: {len(recent)} steps in the last {window_ms:g} ms{note}",
        highlight_steps=lit["steps"] if lit else None,
    )
    # Taller than TIMELINE_HEIGHT_PX only when the legend needs it (more lanes: ranks).
    live_plot(fig, key="live.timeline", height_px=int(fig.layout.height))
    return recent


def draw_kernels(shown: list[StepRecord], source: list[StepRecord], window_ms: float,
                 device: str, stats: dict | None = None) -> None:
    """Under the timeline: the kernel lane (measured kernels of sampled steps; on a GPU
    only: a CPU runs no kernels, and the waterfall's title says so) and the waterfall of the
    timeline's window."""
    end = window_end_ns(shown) or 0
    samples = samples_of(source)
    kept = kept_samples(source)
    if device == "cuda":
        lane = kernel_lane_figure(shown, kept[0] or samples, end_ns=end, window_ms=window_ms,
                                  device=device, width_px=TIMELINE_WIDTH_PX,
                                  height_px=KERNEL_LANE_HEIGHT_PX, sampled_records=kept[1],
                                  stats=stats)
        lane.update_layout(uirevision="live.timeline")
        live_plot(lane, key="live.kernels", height_px=KERNEL_LANE_HEIGHT_PX)
    live_plot(waterfall_figure(shown, kept[0] or samples, device=device,
                               height_px=WATERFALL_HEIGHT_PX, sampled_records=kept[1],
                               window=(end - int(window_ms * 1e6), end) if end else None),
              key="live.waterfall", height_px=WATERFALL_HEIGHT_PX)


def kept_samples(records: list[StepRecord]) -> tuple[list, list[StepRecord]]:
    """The latest kernel samples and their sampled steps' records, kept between refreshes
    (one comes every kernel_sample_period_s, while a snapshot of recent steps of a small
    model reaches back a few seconds): the waterfall and the kernel busy gauge give
    unsampled steps the sampled steps' kernel time per step."""
    kept = keep_samples(records, st.session_state.get("live.kernel_samples"))
    st.session_state["live.kernel_samples"] = kept
    return kept


def frozen_records(client: EngineClient) -> list[StepRecord]:
    """What a pause froze (taken now when the pause came before any live refresh)."""
    frozen = st.session_state.get(FROZEN_KEY) or client.telemetry().snapshot_steps(
        SNAPSHOT_STEPS
    )
    st.session_state[FROZEN_KEY] = frozen
    return frozen


def live_view(client: EngineClient, settings: dict) -> None:
    """History strip and timeline (a fragment every LIVE_PERIOD_S). Paused, it draws the
    frozen snapshot: the same figure each time, so the chart is left alone (and keeps the
    user's zoom), in the same frame as when live."""
    if not client.alive():
        st.rerun()  # the full run shows the dead-engine banner
    # An engine that dies between that check and a call below: the whole app again, which
    # shows the dead-engine message (it was a traceback in this fragment).
    with engine_errors(client, "Reading the engine's telemetry"):
        draw_live(client, settings)


def draw_live(client: EngineClient, settings: dict) -> None:
    """The live view's charts: the history strip, the timeline, the kernel lane and the
    waterfall. (The slots figure is the Recordings page's: drawn here, the paused timeline
    and the charts beside it kept their live figures in Chromium.)"""
    records = client.telemetry().snapshot_steps(SNAPSHOT_STEPS)
    stats = draw_history(client, settings, records)
    window = float(st.session_state.get(WINDOW_KEY, DEFAULT_WINDOW_MS))
    if st.session_state.get(PAUSE_KEY):
        # Exactly the steps the trace download holds (SHOWN_KEY, set by the full run).
        shown = st.session_state.get(SHOWN_KEY)
        if shown is None:
            shown = recent_window(frozen_records(client), window)
        draw_timeline(shown, window, paused=True)
        draw_kernels(shown, frozen_records(client), window, settings.get("device", "cpu"))
    else:
        st.session_state[LAST_KEY] = records  # what a pause would freeze
        shown = draw_timeline(records, window, paused=False)
        draw_kernels(shown, records[-SAMPLE_SCAN_STEPS:], window, settings.get("device", "cpu"),
                     stats=stats)


def control_bar(client: EngineClient) -> None:
    """The controls that act on what the charts show, in one row above them (so the first
    screen holds both, at 1280x800 too): async, slots, CUDA graphs, and the load generator's
    start/stop with its counts. A fragment every second: the toggles follow the engine's
    settings whoever changed them."""
    if engine_status(client).state != "alive":
        return  # the banner says why; a call now would only wait for its timeout
    with engine_errors(client, "Reading the engine's settings"):
        # The watchdog's reading when there is one: a live part of the page makes no
        # call that a hung engine would hold up (fragments of one tab run one at a time).
        settings = current_settings(client)
    toggles, load = st.columns([3, 2], vertical_alignment="bottom")
    with toggles:
        with engine_errors(client, "Engine controls"):
            engine_controls(client, settings)
    with load:
        with engine_errors(client, "Load generator"):
            load_switch(client, settings)


def controls(client: EngineClient) -> None:
    """The load generator's parameters and the detailed gauges (a fragment every second)."""
    if engine_status(client).state != "alive":
        return  # the banner says why; a call now would only wait for its timeout
    with engine_errors(client, "Reading the engine's settings"):
        settings = current_settings(client)
    with st.expander("Load generator", expanded=False, icon=":material/speed:"):
        with engine_errors(client, "Load generator"):
            load_generator(client, settings)
    with st.expander("Gauges: the last 2 s in numbers", icon=":material/speed:"):
        with engine_errors(client, "Reading the engine's gauges"):
            records = client.telemetry().snapshot_steps(SNAPSHOT_STEPS)
            stats = client.stats()
            # A step still in flight (or still on the wire) is busy, not idle time.
            window = gauge_window(records, stats, time.perf_counter_ns())
            kept = kept_samples(records)
            values = gauge_values(
                recent_window(records, GAUGE_WINDOW_MS, end_ns=window.end_ns),
                window,
                stats=stats,
                nvml=client.nvml(),
                nvml_reason=client.nvml_reason(),
                max_num_seqs=int(settings.get("max_num_seqs", 0)),
                # In-step gaps from the Step anatomy page's latest recording, if any.
                calibration=(st.session_state.get("anatomy.result") or {}).get("calibration"),
                samples=kept[0],
                sampled_records=kept[1],
            )
            # Drawn in place like the charts above (a plain st.plotly_chart was rebuilt on
            # every refresh and showed blank for one frame in forty).
            live_plot(gauges_figure(values, GAUGES_HEIGHT_PX,
                                    device=settings.get("device", "cuda")),
                      key="live.gauges", height_px=GAUGES_HEIGHT_PX)


def freeze() -> None:
    """Pause on what was on screen at the moment of the click; resuming forgets it (and a
    request's highlighted steps: a pause of one's own highlights nothing)."""
    st.session_state.pop(HIGHLIGHT_KEY, None)
    if st.session_state.get(PAUSE_KEY):
        st.session_state[FROZEN_KEY] = st.session_state.get(LAST_KEY, [])
    else:
        st.session_state.pop(FROZEN_KEY, None)


def pause_for_trace() -> None:
    st.session_state[PAUSE_KEY] = True
    freeze()


def trace_download(shown: list[StepRecord], client: EngineClient) -> None:
    """The Chrome trace of exactly the steps on screen (a paused timeline).

    The file is built by this full run and stays registered until the next one. A live
    download (deferred data built on click) would race Streamlit's clean-up of unreferenced
    files, which every 1-2 Hz fragment run triggers, and often answer 404.
    """
    if not shown:
        st.download_button(
            "Download the Chrome trace of the steps on screen",
            b"",
            disabled=True,
            key="live.trace",
            help="No steps on screen yet.",
        )
        return
    st.download_button(
        "Download the Chrome trace of the steps on screen",
        # The request events too: each request's track gets its time in queue and its end.
        data=chrome_trace_json(shown, client.telemetry().snapshot_events(TRACE_EVENTS)),
        file_name=f"gapless-steps-{shown[0].step}-{shown[-1].step}.json",
        mime="application/json",
        key="live.trace",
        icon=":material/download:",
        on_click="ignore",
        help="Open it in Perfetto (ui.perfetto.dev) or chrome://tracing.",
    )


def draw_live_page() -> None:
    client = engine_client()
    with engine_errors(client, "Reading the engine's settings"):
        settings = client.settings()
    paused = bool(st.session_state.get(PAUSE_KEY))
    window = float(st.session_state.get(WINDOW_KEY, DEFAULT_WINDOW_MS))
    shown = recent_window(frozen_records(client), window) if paused else []
    st.session_state[SHOWN_KEY] = shown if paused else None
    live_fragment(control_bar, CONTROLS_PERIOD_S)(client)
    live_fragment(live_view, LIVE_PERIOD_S)(client, settings)

    pause_col, window_col, trace_col = st.columns([1, 2, 2], vertical_alignment="bottom")
    with pause_col:
        st.toggle(
            "Pause",
            key=PAUSE_KEY,
            on_change=freeze,
            help="Freeze the timeline on what is on screen; the engine keeps running.",
        )
    with window_col:
        st.select_slider(
            "Timeline window (ms)", TIMELINE_WINDOWS_MS, value=DEFAULT_WINDOW_MS, key=WINDOW_KEY
        )
    with trace_col:
        if paused:
            trace_download(shown, client)
        else:
            st.button(
                "Pause to download the Chrome trace of the steps on screen",
                key="live.trace_pause",
                icon=":material/download:",
                on_click=pause_for_trace,
            )
    st.caption(ASYNC_NOTE)
    device_notice(settings, client)
    with st.expander("Token budget: what-if, and each change predicted then measured",
                     icon=":material/tune:"):
        live_fragment(token_budget_panel, BUDGET_PERIOD_S)(client)
    live_fragment(controls, CONTROLS_PERIOD_S)(client)
    prefill_tax_live(client)


def live_page() -> None:
    """The page (app.py lists this function, not the file: see the module's docstring)."""
    run_page(draw_live_page)
