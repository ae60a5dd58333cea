"""What a page shows when the engine is in trouble: a dead engine (with a restart button) or a
hung one (with kill-and-restart), then the page stops there.

Shared by ui/client.py (a page's first call, or a call inside engine_errors, fails) and
ui/banner.py (the banner notices a hang); it sits below both so neither imports the other.
Owns the two messages, their buttons, the restart's progress, the note for a call answered
late by a busy engine whose heartbeat still comes (busy, not hung), and the watch that
brings a stopped page back once the engine runs again. A button remembers which engine
process its view showed (the client's ``generation``); a click on a stale view does nothing
and says so (ui.status refuses a plain restart whenever the engine runs, and a kill once
the hang has ended or the engine was restarted). While a restart runs, the clicked button
is replaced by a disabled one, and a dead page drawn in another tab shows its button
disabled, naming the tab that restarts. Every restart and kill, and every refusal, is logged
with the tab that asked. The page stops with ui.fragments.stop_page, never st.stop. It must
never show a traceback (details go to the server log), and never call st.* off the script
thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import streamlit as st

from ui.fragments import in_fragment, live_fragment, stop_page
from ui.status import (
    RESTARTING,
    StaleRestart,
    engine_status,
    kill_and_restart,
    restart_keeping_settings,
)
from ui.tab import tab_id

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")

# (kind, generation seen, the clicked button's key) of a click not yet carried out
RESTART_ASK_KEY = "ui.restart_asked"
RESTART_ERROR_KEY = "ui.kill_restart_error"
RECOVERY_PERIOD_S = 1.0
REDRAW_DEAD_S = 4.0  # a dead page runs again this often (see _await_recovery_dead)
DEAD_DRAWN_KEY = "ui.dead_page_drawn_at"  # monotonic time of the dead page's last run
RESTART_LABEL = "Restart the engine"
KILL_LABEL = "Kill and restart the engine"


def _ask(kind: str, generation: Any, key: str) -> None:
    st.session_state[RESTART_ASK_KEY] = (kind, generation, key)


def carry_out_restart(client: EngineClient) -> None:
    """The restart a click asked for, in the page's run with its progress shown (a callback
    would leave the page greyed and silent for the seconds a start takes). The progress
    and a disabled button take the places of the message and the button clicked, so the
    old button cannot be clicked again while the restart runs."""
    asked = st.session_state.pop(RESTART_ASK_KEY, None)
    if asked is None:
        return
    kind, seen, key = (*asked, None)[:3]
    who = tab_id()
    label = "Killing the engine and starting a new one" if kind == "kill" else \
        "Starting a new engine"
    box = st.status(f"{label} (loading the model)...", expanded=True)
    # The clicked button again, by its key (the browser matches keyed elements by key, and
    # kept the old one, enabled, beside a new one of another key), disabled.
    st.button(KILL_LABEL if kind == "kill" else RESTART_LABEL,
              key=key or f"ui.{kind}_under_way", type="primary", disabled=True,
              help="A restart is under way.")
    t0 = time.monotonic()
    try:
        if kind == "kill":
            kill_and_restart(client, who, seen_generation=seen)
        else:
            restart_keeping_settings(client, who, seen_generation=seen)
    except StaleRestart as e:
        box.update(label=f"Nothing done: {e}.", state="complete", expanded=False)
        st.session_state[RESTART_ERROR_KEY] = ("info", f"Nothing done: {e}.")
    except Exception as exc:  # shown on the next run, never as a traceback
        log.exception("engine restart failed")
        st.session_state[RESTART_ERROR_KEY] = (
            "error", f"Restart failed: {exc or type(exc).__name__}")
    else:
        box.update(label=f"The engine is running again ({time.monotonic() - t0:.1f} s); "
                         "settings and load generator restored.", state="complete")
    st.rerun()


def show_restart_outcome() -> None:
    outcome = st.session_state.pop(RESTART_ERROR_KEY, None)
    if outcome:
        kind, text = outcome
        (st.info if kind == "info" else st.error)(text)


def _await_recovery(client: EngineClient, seen: Any) -> None:
    """A stopped page's watch (a fragment, every second): once the engine is running again
    (restarted from another tab, or resumed), redraw the whole page."""
    if getattr(client, "generation", None) != seen and client.alive():
        st.rerun(scope="app")
    if engine_status(client).state == "alive":
        st.rerun(scope="app")


def _await_recovery_dead(client: EngineClient, seen: Any) -> None:
    """The dead page's watch: `_await_recovery`, and while the engine stays dead, the whole
    page again every REDRAW_DEAD_S after its last run (DEAD_DRAWN_KEY). In Chromium a dead
    page was sometimes left with its message and its Restart button hidden (Streamlit kept
    the button as a "retained" element that no later run drew), and nothing ran the page
    again. The button stays drawn by the page's run, not by this fragment: a fragment's
    redraw replaces its elements each time, and a click on the button then waits for a
    stable element."""
    _await_recovery(client, seen)
    drawn = st.session_state.get(DEAD_DRAWN_KEY)
    if drawn is not None and time.monotonic() - drawn >= REDRAW_DEAD_S:
        st.rerun(scope="app")


def show_dead_engine(client: EngineClient, not_responding: str | None = None, *,
                     kept: Callable[[], None] | None = None) -> NoReturn:
    """Say that the engine died (or, with ``not_responding``, hangs) and why, offer a
    restart (which kills a hung engine), draw what the page keeps in view without an engine
    (``kept``: the Playground's conversation, a reply cut by the death included), and stop
    the page here. Met inside a live fragment, it reruns the whole app instead, whose first
    engine call draws this at the top level (ui/fragments.py says why)."""
    if in_fragment():
        st.rerun(scope="app")
    carry_out_restart(client)
    reason = None
    try:
        reason = client.death_reason()
    except Exception:  # a client too broken to say why still gets the banner
        log.exception("death_reason() failed")
    if not_responding is not None and reason is None:
        st.error(f"The engine is not responding: {not_responding}.")
    else:
        st.error(f"The engine is not running: {reason or 'the engine process is gone'}.")
    seen = getattr(client, "generation", None)
    restarting = RESTARTING.by()
    st.button(RESTART_LABEL, key="ui.restart", type="primary", on_click=_ask,
              args=("restart", seen, "ui.restart"), disabled=restarting is not None,
              help=f"{restarting} is restarting the engine." if restarting else None)
    if restarting:
        st.caption(f":material/restart_alt: {restarting} is restarting the engine; this "
                   "page follows once it runs.")
    st.session_state[DEAD_DRAWN_KEY] = time.monotonic()
    show_restart_outcome()
    live_fragment(_await_recovery_dead, RECOVERY_PERIOD_S)(client, seen)
    if kept is not None:
        kept()
    stop_page()


def show_not_responding(client: EngineClient, reason: str | None, key: str) -> None:
    """Say the engine is hung and offer to kill and restart it (the settings are kept)."""
    carry_out_restart(client)
    st.error(
        f"**The engine is not responding** ({reason or 'no answer within 2 s'}). "
        "It may be stopped (SIGSTOP) or stuck in a long step; pages stay usable but show "
        "nothing new. A change made now may apply when it resumes.",
        icon=":material/hourglass_disabled:",
    )
    st.button(
        KILL_LABEL,
        key=key,
        type="primary",
        icon=":material/restart_alt:",
        on_click=_ask,
        args=("kill", getattr(client, "generation", None), key),
        help="SIGKILL the engine process and start a new one with the same live settings.",
    )
    show_restart_outcome()


def stop_busy(client: EngineClient, late: str) -> NoReturn:
    """A call got no answer in time while the engine's heartbeat still comes: it is busy,
    not hung. Say so (never "not responding", and no kill button), and stop the page; the
    watch redraws it a second later, when the call is made again. Inside a live fragment
    only the fragment stops: it runs again within its own period (no watch of its own there,
    see ui/fragments.py)."""
    st.info(
        f"**The engine is busy** ({late}). It is running (its heartbeat arrives): a long "
        "step or a loaded machine. This page tries again in a second.",
        icon=":material/hourglass_top:",
    )
    if not in_fragment():
        live_fragment(_retry_later, RECOVERY_PERIOD_S)(time.monotonic())
    stop_page()


def _retry_later(since: float) -> None:
    """A busy page's watch: the whole page again once a period has passed (not on the
    fragment's first run, inside the page's run: that would rerun at once, again and again,
    while the engine stays busy)."""
    if time.monotonic() - since >= RECOVERY_PERIOD_S:
        st.rerun(scope="app")


def stop_not_responding(client: EngineClient, reason: str | None) -> NoReturn:
    """Say the engine is hung, offer kill-and-restart, and stop the page with a watch that
    redraws it once the engine answers. Inside a live fragment: the whole app again instead
    (as show_dead_engine)."""
    if in_fragment():
        st.rerun(scope="app")
    show_not_responding(client, reason, key="ui.kill_restart_page")
    live_fragment(_await_recovery, RECOVERY_PERIOD_S)(
        client, getattr(client, "generation", None))
    stop_page()
