"""What a page shows when the engine is in trouble: a dead engine (with a restart button) or a
hung one (with kill-and-restart), then the page stops there.

Shared by ui/client.py (a page's first call, or a call inside engine_errors, fails) and
ui/banner.py (the banner notices a hang); it sits below both so neither imports the other.
Owns the two messages and their buttons' callbacks. It must never wait on the engine, never
show a traceback (details go to the server log), and never call st.* off the script thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NoReturn

import streamlit as st

from ui.status import kill_and_restart, restart_keeping_settings

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")


def show_dead_engine(client: EngineClient, not_responding: str | None = None) -> NoReturn:
    """Say that the engine died (or, with ``not_responding``, hangs) and why, offer a
    restart (which kills a hung engine), and stop the page here."""
    reason = None
    try:
        reason = client.death_reason()
    except Exception:  # a client too broken to say why still gets the banner
        log.exception("death_reason() failed")
    if not_responding is not None and reason is None:
        st.error(f"The engine is not responding: {not_responding}.")
    else:
        st.error(f"The engine is not running: {reason or 'the engine process is gone'}.")

    def restart() -> None:
        try:
            restart_keeping_settings(client)
        except Exception as exc:  # shown on the next run, never as a traceback
            log.exception("engine restart failed")
            st.session_state["ui.restart_error"] = str(exc) or type(exc).__name__

    st.button("Restart the engine", key="ui.restart", type="primary", on_click=restart)
    failed = st.session_state.pop("ui.restart_error", None)
    if failed:
        st.error(f"Restart failed: {failed}")
    st.stop()


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
