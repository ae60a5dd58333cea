"""gapless dashboard: the Streamlit entry point and its Live page.

`streamlit run app.py` starts one engine process (ui/client.py) and shows where every CPU
and device microsecond goes. This file owns the page list (st.navigation) and the Live page:
the step timeline, the gauges, the controls acting on the running engine and the Chrome
trace download. Figures come from ui/ (pure functions); the engine is reached only through
the shared client.

It must never draw from a thread other than the script's, and never rebuild the timeline
faster than once a second (Plotly work here competes for the CPU with the engine's prep).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.export import chrome_trace_json
from telemetry.records import StepRecord
from ui.client import engine_client, engine_errors, show_flashes
from ui.controls import engine_controls, load_generator, mode_summary
from ui.gauges import gauge_values, gauges_figure, live_window, steps_in_flight
from ui.timeline import recent_window, timeline_figure

if TYPE_CHECKING:
    from engine.process.client import EngineClient

GAUGE_PERIOD_S = 0.5  # 2 Hz
TIMELINE_PERIOD_S = 1.0  # 1 Hz, the most DESIGN.md §7 allows
GAUGE_WINDOW_MS = 2000.0
TIMELINE_WINDOWS_MS = (50, 100, 250, 500, 1000, 2000, 5000)
DEFAULT_WINDOW_MS = 1000  # a few CPU steps, a few hundred GPU steps
SNAPSHOT_STEPS = 4000  # the newest steps taken from the bus per refresh (a slice, no copy)
TIMELINE_WIDTH_PX = 1600  # for merging sub-pixel spans; about a wide browser window

PAUSE_KEY = "live.pause"
FROZEN_KEY = "live.frozen"
WINDOW_KEY = "live.window_ms"
LAST_KEY = "live.last_records"


def device_notice(settings: dict, client: EngineClient) -> None:
    """Say plainly when there is no GPU, and what that changes on this page."""
    if settings.get("device") == "cuda":
        return
    reason = client.nvml_reason() or "no GPU: NVML is not available"
    st.info(
        f"**No GPU** ({reason}). The engine runs on the CPU; the h2d, compute and d2h lanes "
        "are the same pipeline with each stream emulated by a worker thread, so sync and "
        "async still differ. CUDA graphs and NVML utilisation need a GPU.",
        icon=":material/memory:",
    )


@st.fragment(run_every=GAUGE_PERIOD_S)
def gauges(client: EngineClient, max_num_seqs: int) -> None:
    if not client.alive():
        st.rerun()  # the full run shows the dead-engine banner with its restart button
    with engine_errors(client, "Reading the engine's gauges"):
        records = client.telemetry().snapshot_steps(SNAPSHOT_STEPS)
        stats = client.stats()
        # A step still in flight (or still on the wire) is not idle time.
        window = live_window(records[-16:], time.perf_counter_ns(), GAUGE_WINDOW_MS,
                             in_flight=steps_in_flight(records[-16:], stats))
        values = gauge_values(
            recent_window(records, GAUGE_WINDOW_MS, end_ns=window[1]),
            window,
            stats=stats,
            nvml=client.nvml(),
            nvml_reason=client.nvml_reason(),
            max_num_seqs=max_num_seqs,
            # In-step gaps from the Step anatomy page's latest recording, if any.
            calibration=(st.session_state.get("anatomy.result") or {}).get("calibration"),
        )
        st.plotly_chart(gauges_figure(values), key="live.gauges", config={"displaylogo": False})


def draw_timeline(records: list[StepRecord], window_ms: float, paused: bool) -> list[StepRecord]:
    """Draw the timeline of the newest ``window_ms``; returns the steps it shows."""
    recent = recent_window(records, window_ms) if records else []
    fig = timeline_figure(
        recent,
        window_ms=window_ms,
        width_px=TIMELINE_WIDTH_PX,
        title=(
            f"Paused: {len(recent)} steps (zoom and pan freely)"
            if paused
            else f"Live: the last {len(recent)} steps"
        ),
    )
    st.plotly_chart(fig, key="live.timeline", config={"displaylogo": False})
    return recent


def live_timeline(client: EngineClient) -> None:
    """The timeline's live refresh (run as a fragment every TIMELINE_PERIOD_S)."""
    if not client.alive():
        st.rerun()  # the full run shows the dead-engine banner
    records = client.telemetry().snapshot_steps(SNAPSHOT_STEPS)
    st.session_state[LAST_KEY] = records  # what a pause would freeze
    draw_timeline(records, float(st.session_state.get(WINDOW_KEY, DEFAULT_WINDOW_MS)), paused=False)


def freeze() -> None:
    """Pause on what was on screen at the moment of the click; resuming forgets it."""
    if st.session_state.get(PAUSE_KEY):
        st.session_state[FROZEN_KEY] = st.session_state.get(LAST_KEY, [])
    else:
        st.session_state.pop(FROZEN_KEY, None)


def pause_for_trace() -> None:
    st.session_state[PAUSE_KEY] = True
    freeze()


def trace_download(shown: list[StepRecord]) -> None:
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
        data=chrome_trace_json(shown),
        file_name=f"gapless-steps-{shown[0].step}-{shown[-1].step}.json",
        mime="application/json",
        key="live.trace",
        icon=":material/download:",
        on_click="ignore",
        help="Open it in Perfetto (ui.perfetto.dev) or chrome://tracing.",
    )


def live_page() -> None:
    client = engine_client()
    show_flashes()
    with engine_errors(client, "Reading the engine's settings"):
        settings = client.settings()
    st.title("Live")
    st.markdown(mode_summary(settings), help="What the engine runs right now.")
    device_notice(settings, client)

    with st.container(border=True):
        with engine_errors(client, "Engine controls"):
            engine_controls(client, settings)
    with st.expander("Load generator", expanded=True, icon=":material/speed:"):
        with engine_errors(client, "Load generator"):
            load_generator(client, int(settings.get("max_num_seqs", 8)))

    gauges(client, int(settings.get("max_num_seqs", 0)))

    pause_col, window_col = st.columns([1, 3])
    with pause_col:
        paused = st.toggle(
            "Pause",
            key=PAUSE_KEY,
            on_change=freeze,
            help="Freeze the timeline so it can be zoomed; the engine keeps running.",
        )
    with window_col:
        st.select_slider(
            "Timeline window (ms)", TIMELINE_WINDOWS_MS, value=DEFAULT_WINDOW_MS, key=WINDOW_KEY
        )
    if paused:
        # A frozen snapshot is drawn once by this full run; nothing redraws it until the
        # pause ends, so plotly keeps the user's zoom.
        frozen = st.session_state.get(FROZEN_KEY) or client.telemetry().snapshot_steps(
            SNAPSHOT_STEPS
        )
        st.session_state[FROZEN_KEY] = frozen
        shown = draw_timeline(frozen, float(st.session_state[WINDOW_KEY]), paused=True)
        trace_download(shown)
    else:
        st.fragment(run_every=TIMELINE_PERIOD_S)(live_timeline)(client)
        st.button(
            "Pause to download the Chrome trace of the steps on screen",
            key="live.trace_pause",
            icon=":material/download:",
            on_click=pause_for_trace,
        )


def main() -> None:
    st.set_page_config(page_title="gapless", page_icon=":material/timeline:", layout="wide")
    pages = [
        st.Page(live_page, title="Live", icon=":material/monitoring:", default=True),
        st.Page("pages/playground.py", title="Playground", icon=":material/chat:"),
        st.Page("pages/benchmark.py", title="Benchmark", icon=":material/speed:"),
        st.Page("pages/requests.py", title="Requests", icon=":material/list:"),
        st.Page("pages/anatomy.py", title="Step anatomy", icon=":material/biotech:"),
    ]
    st.navigation(pages).run()


main()
