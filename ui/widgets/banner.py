"""The strip at the top of every page: the engine's actual settings, a hung engine, a
running benchmark. Redrawn once a second in a fragment, so a change made anywhere (another
tab, the benchmark, an API call) shows on every tab within two seconds.

Owns ``status_banner`` (the fragment) and the benchmark line; the not-responding message with
its kill-and-restart button is ui/engine_link.py's, shared with ui/engine_link.py. It must never
wait on the engine longer than one short call, and never call st.* off the script thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import streamlit as st

from ui.engine_link import (
    BANNER_PERIOD_S,
    HANG,
    EngineStatus,
    current_settings,
    engine_status,
    show_not_responding,
)
from ui.widgets.bench_runner import RUNS, base_label
from ui.widgets.controls import mode_summary
from ui.widgets.fragments import live_fragment

if TYPE_CHECKING:
    from engine.process.client import EngineClient

OTHER_CLIENT_BENCHMARK = (
    "**A benchmark started by another client of this engine is running**: the engine's "
    "settings change with each of its runs, and new prompts, setting changes and the load "
    "generator wait until it ends."
)


def benchmark_line(settings: dict[str, Any] | None = None) -> str | None:
    """What the banner says of a running benchmark: this dashboard's own (with its progress),
    or one the engine says another client started (``benchmark_running`` in its settings)."""
    run = RUNS.running()
    if run is None:
        return OTHER_CLIENT_BENCHMARK if settings and settings.get("benchmark_running") else None
    with run.lock:
        p = run.progress
        label = p.label or "starting"
        return (
            f"**A benchmark is running** ({base_label(label)}, run {min(p.run_index + 1, p.runs)}"
            f" of {p.runs}, {time.monotonic() - run.started:.0f} s): the engine's settings "
            "change with each run and new prompts, setting changes and the load generator "
            "wait until it ends. Follow it on the Benchmark page."
        )


def _banner(client: EngineClient, show_settings: bool) -> None:
    status = engine_status(client)
    if status.state == "dead":
        st.rerun()  # the full run shows the dead-engine message and its restart button
    settings: dict[str, Any] | None = None
    # While the engine is not responding no call is made here: the client's status() or,
    # without one, ui.engine_link.Watchdog's probe notices when it answers again.
    if status.state == "alive":
        try:
            settings = current_settings(client)
            status = EngineStatus("alive")
        except TimeoutError:
            HANG.timed_out()
            status = engine_status(client)
        except Exception:
            if not client.alive():
                st.rerun()
            raise
    if status.state == "not_responding":
        show_not_responding(client, status.reason, key="ui.kill_restart_banner")
        return
    line = benchmark_line(settings)
    if line:
        st.warning(line, icon=":material/speed:")
    if show_settings and settings is not None:
        st.markdown(
            mode_summary(settings), help="What the engine runs right now (checked every second)."
        )


def status_banner(client: EngineClient, *, show_settings: bool = True) -> None:
    """The banner fragment (call it once, near the top of every page)."""
    live_fragment(_banner, BANNER_PERIOD_S)(client, show_settings)
