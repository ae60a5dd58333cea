"""The strip at the top of every page: the engine's actual settings, a hung engine, a
running benchmark. Redrawn once a second in a fragment, so a change made anywhere (another
tab, the benchmark, an API call) shows on every tab within two seconds.

Owns ``status_banner`` (the fragment) and ``not_responding`` (the message with its
kill-and-restart button, also used by ui/client.py when a page's first call times out). It
must never wait on the engine longer than one short call, and never call st.* off the
script thread.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NoReturn

import streamlit as st

from ui.bench_runner import RUNS, base_label
from ui.controls import mode_summary
from ui.status import (
    BANNER_PERIOD_S,
    HANG,
    EngineStatus,
    current_settings,
    engine_status,
    kill_and_restart,
)

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")
RESTART_ERROR_KEY = "ui.kill_restart_error"


def _kill_and_restart(client: EngineClient) -> None:
    try:
        kill_and_restart(client)
    except Exception as exc:  # shown on the next run, never as a traceback
        log.exception("kill and restart failed")
        st.session_state[RESTART_ERROR_KEY] = str(exc) or type(exc).__name__


def show_not_responding(client: EngineClient, reason: str | None, key: str) -> None:
    """Say the engine is hung and offer to kill and restart it (the settings are kept)."""
    st.error(
        f"**The engine is not responding** ({reason or 'no answer within 2 s'}). "
        "It may be stopped (SIGSTOP) or stuck in a long step; pages stay usable but show "
        "nothing new. A change made now may apply when it resumes.",
        icon=":material/hourglass_disabled:",
    )
    st.button(
        "Kill and restart the engine",
        key=key,
        type="primary",
        icon=":material/restart_alt:",
        on_click=_kill_and_restart,
        args=(client,),
        help="SIGKILL the engine process and start a new one with the same live settings.",
    )
    failed = st.session_state.pop(RESTART_ERROR_KEY, None)
    if failed:
        st.error(f"Restart failed: {failed}")


def stop_not_responding(client: EngineClient, reason: str | None) -> NoReturn:
    show_not_responding(client, reason, key="ui.kill_restart_page")
    st.stop()


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
    # without one, ui.status.Watchdog's probe notices when it answers again.
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
    st.fragment(run_every=BANNER_PERIOD_S)(_banner)(client, show_settings)
