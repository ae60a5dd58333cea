"""A/B page: capture a window of live steps in one mode, switch, capture another, compare.

Owns the captures of one browser tab (session state) and the one-click comparison: with
load running (started here for the comparison when none is), it switches the engine to sync,
lets the old mode's steps drain, records a window from the telemetry bus, does the same in
async, and puts the engine's settings (and the load generator) back as they were. Manual
"capture A / capture B" buttons compare any two settings (slots, CUDA graphs). The view
itself is ui/widgets/ab_view.py, shared with the Recordings page.

It must never leave the engine in a mode the user did not choose (settings are restored,
also on error), and never capture while a benchmark runs (the engine refuses the switch).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import streamlit as st

from engine.process.supervision import kept_live_settings
from ui.engine_link import engine_client, engine_errors
from ui.figures.ab import Window
from ui.widgets.ab_view import show_ab
from ui.widgets.controls import load_spec_from_state, stop_load
from ui.widgets.fragments import run_page
from ui.widgets.tab import tab_id

if TYPE_CHECKING:
    from engine.process.client import EngineClient

CAPTURES_KEY = "ab.captures"
SECONDS_KEY = "ab.seconds"
SETTLE_S = 0.5  # steps of the previous mode still finishing after a switch
ROUNDS = 3  # sync, async, sync, async, sync, async: the verdict's interval needs 3 pairs


def describe(settings: dict[str, Any]) -> str:
    label = "async" if settings.get("async_batching") else "sync"
    label += f" {settings.get('num_slots')} slots"
    if settings.get("cuda_graphs"):
        label += " +graphs"
    return label


def capture(client: EngineClient, label: str, seconds: float, mode: str | None = None) -> Window:
    """The steps published during the next ``seconds`` (only ``mode``'s, when given)."""
    reader = client.telemetry().reader(from_now=True)
    t0 = time.perf_counter_ns()
    time.sleep(seconds)
    t1 = time.perf_counter_ns()
    steps = [r for r in reader.steps() if r.spans and (mode is None or r.mode == mode)]
    return Window(label, steps, t0, t1)


def one_click(client: EngineClient, seconds: float, rounds: int = ROUNDS,
              who: str = "a tab") -> dict[str, Window]:
    """sync, async, sync, async... (``rounds`` pairs, ``seconds`` per mode in all) under
    load; the settings and the load generator restored after. Each side's Window draws its
    last capture and carries every capture in ``runs`` for the verdict's interval. Every
    change is logged as ``who``'s A/B comparison."""
    origin = f"{who}, A/B comparison"
    before = client.settings()
    started_load = False
    if not client.load_running():
        client.start_load(load_spec_from_state())
        started_load = True
    try:
        runs: dict[str, list[Window]] = {"A": [], "B": []}
        for _ in range(rounds):
            for key, mode in (("A", "sync"), ("B", "async")):
                client.configure(async_batching=mode == "async", origin=origin)
                time.sleep(SETTLE_S)
                settings = client.settings()
                runs[key].append(capture(client, describe(settings), seconds / rounds, mode))
        out = {}
        for key, caps in runs.items():
            last = caps[-1]
            out[key] = Window(last.label, last.records, last.start_ns, last.end_ns,
                              runs=[c.records for c in caps])
        return out
    finally:
        client.configure(**kept_live_settings(before), origin=origin)
        if started_load:
            stop_load(client, f"{who}'s A/B comparison")


def main() -> None:
    client = engine_client()
    st.title("A/B")
    st.caption(
        "Compare two modes on the live engine under the same load. The one-click comparison "
        f"alternates sync and async {ROUNDS} times; the verdict compares decode-only steps "
        "(prefill apart) and gives the difference with a 95% interval over those alternated "
        "pairs (two single captures: a block bootstrap of their decode-only steps). The "
        "figures and both timelines (the last capture of each side) share one scale."
    )
    captures: dict[str, Window] = st.session_state.setdefault(CAPTURES_KEY, {})
    seconds = float(st.select_slider("Capture length per mode (s)", (1, 2, 3, 5, 10), value=3,
                                     key=SECONDS_KEY))
    c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
    with c1:
        if st.button("Compare sync and async", key="ab.one_click", type="primary",
                     icon=":material/compare:",
                     help="Under load (started for the capture when none runs): sync and "
                     f"async in turn, {ROUNDS} times, {seconds:g} s of each in all; your "
                     "settings are put back after."):
            total = 2 * (seconds + ROUNDS * SETTLE_S)
            with st.spinner(f"Capturing sync and async in turn ({total:.0f} s)..."):
                with engine_errors(client, "The comparison failed") as outcome:
                    got = one_click(client, seconds, who=tab_id())
                if not outcome.failed:
                    captures.clear()
                    captures.update(got)
    for col, key in ((c2, "A"), (c3, "B")):
        with col:
            if st.button(f"Capture {key} (current settings)", key=f"ab.capture_{key}"):
                with st.spinner(f"Capturing {seconds:g} s..."):
                    with engine_errors(client, f"Capture {key}"):
                        settings = client.settings()
                        captures[key] = capture(client, f"{key}: {describe(settings)}", seconds)
    with c4:
        if st.button("Clear", key="ab.clear", disabled=not captures):
            captures.clear()
            st.rerun()
    if "A" in captures and "B" in captures:
        a, b = captures["A"], captures["B"]
        if not a.records or not b.records:
            st.warning("A capture holds no steps: start the load generator (Live page) and "
                       "capture again.")
            return
        show_ab(a, b, key="ab.view")
    elif captures:
        have = ", ".join(sorted(captures))
        st.info(f"Captured {have}: change a setting on the Live page, then capture the other.")
    else:
        st.info("Click **Compare sync and async**, or capture A, change a setting on the Live "
                "page, and capture B.")


run_page(main)
