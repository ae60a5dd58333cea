"""The one engine client every page shares, and how engine failures reach the user.

Owns the ``st.cache_resource`` singleton of engine.process.client.EngineClient (one engine process
per Streamlit server, shut down when the cache entry is released) and the messages shown
for an engine that would not start and a rejected request (a dead or hung engine's are
ui/engine_trouble.py's). Pages get the client only through ``engine_client()``; nothing else in the
dashboard constructs one.

It must never show a traceback to the user (errors become st.error messages; details go to
the server log), and never call st.* from a thread other than the script's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from engine.process.client import EngineDead, EngineNotResponding
from ui.engine_trouble import (
    carry_out_restart,
    show_dead_engine,
    show_restart_outcome,
    stop_busy,
    stop_not_responding,
)
from ui.fragments import stop_page

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")

# The engine's settings file; GAPLESS_CONFIG points elsewhere (tests, other machines).
CONFIG_ENV = "GAPLESS_CONFIG"
# A running engine to watch instead of starting one (`python -m engine serve` prints it).
SOCKET_ENV = "GAPLESS_ENGINE_SOCKET"
DEFAULT_CONFIG = "config.yaml"


def config_path() -> str:
    return os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)


def make_client() -> EngineClient:
    """Attach to the engine named by $GAPLESS_ENGINE_SOCKET (an HTTP `serve`, say), else start
    an engine process (the seam tests replace with a fake)."""
    from engine.process.client import EngineClient
    from ui.status import UI_CALL_TIMEOUT_S

    socket_path = os.environ.get(SOCKET_ENV)
    if socket_path:
        return EngineClient.attach(socket_path, call_timeout_s=UI_CALL_TIMEOUT_S)
    from engine.config import EngineConfig

    path = config_path()
    http_port = EngineConfig.from_yaml(path).http_port if Path(path).is_file() else None
    if http_port is None:
        # Short calls: a hung engine must not freeze a page (streams and benchmarks don't
        # wait on this; each of their items has its own wait).
        return EngineClient(config_path=path, call_timeout_s=UI_CALL_TIMEOUT_S)
    # config.yaml turns the HTTP API on: the engine listens on a socket and a serve process
    # attaches to it (started here, stopped with the engine in _release).
    from engine.process.client import default_socket_path
    from ui.http_sidecar import start_http_api

    sock = default_socket_path()
    client = EngineClient(config_path=path, call_timeout_s=UI_CALL_TIMEOUT_S, listen=sock)
    client.http_api = start_http_api(sock, path, http_port)  # type: ignore[attr-defined]
    return client


def _release(client: EngineClient) -> None:
    # Called when the cache entry goes (st.cache_resource.clear(), tests): stop the engine.
    from ui.http_sidecar import stop_http_api

    stop_http_api(getattr(client, "http_api", None))
    try:
        client.shutdown()
    except Exception:  # the engine may already be gone; releasing must not fail
        log.exception("engine shutdown on cache release failed")


@st.cache_resource(on_release=_release, show_spinner="Starting the engine...")
def _shared_client() -> EngineClient:
    return make_client()


def engine_client(*, kept_when_dead: Callable[[], None] | None = None) -> EngineClient:
    """The shared, live engine client; otherwise a message (and restart button) and a stop.
    ``kept_when_dead`` draws what the page still shows under a dead engine's message."""
    try:
        client = _shared_client()
    except Exception as exc:  # the boundary: whatever went wrong, the user reads a message
        log.exception("engine failed to start")
        st.error(f"The engine could not start: {exc}")
        st.caption(f"Settings file: `{config_path()}`. Details are in the server's log.")
        if st.button("Try again", key="ui.retry_start"):
            st.rerun()
        stop_page()
    from ui.status import engine_status, watch

    carry_out_restart(client)  # a restart clicked in this tab (it may find it stale)
    watch(client)  # a stand-in heartbeat while the client has no status() of its own
    status = engine_status(client)
    if status.state == "dead":
        show_dead_engine(client, kept=kept_when_dead)
    if status.state == "not_responding":
        stop_not_responding(client, status.reason)
    show_restart_outcome()
    return client


@dataclass(slots=True)
class Outcome:
    """Whether an engine_errors block failed (its message was shown)."""

    failed: bool = False


@contextmanager
def engine_errors(client: EngineClient, what: str) -> Iterator[Outcome]:
    """Turn an engine failure inside the block into a message for the user.

    A dead engine shows the restart banner and stops the page; a rejected input
    (ValueError carrying the engine's message) is shown as ``"<what>: <message>"``, the
    yielded Outcome is marked failed and the page goes on.
    """
    outcome = Outcome()
    try:
        yield outcome
    except ValueError as exc:
        outcome.failed = True
        st.error(f"{what}: {exc}")
    except EngineDead:
        show_dead_engine(client)
    except TimeoutError as exc:
        from ui.status import HANG, engine_status

        limit = getattr(client, "call_timeout_s", 2.0)
        late = f"{what}: no answer within {limit:g} s"
        # A call that outlasts its limit is not a hang by itself: a busy engine (a long
        # step, a loaded machine) answers late while its heartbeat keeps coming. Where the
        # client has a heartbeat, only its silence (EngineNotResponding, status()) says
        # "not responding"; without one, a late answer is all there is to go by.
        heartbeat = callable(getattr(client, "status", None))
        if (heartbeat and not isinstance(exc, EngineNotResponding)
                and engine_status(client).state == "alive"):
            stop_busy(client, late)
        HANG.timed_out()
        stop_not_responding(client, late)


def in_callback(what: str, action: Callable[[], object]) -> str | None:
    """Run an engine command from a widget callback; what went wrong, for the user (shown
    by the caller beside the widget, in the run that follows the callback), or None.

    A dead engine needs no message here: the run that follows shows the restart banner.
    """
    try:
        action()
    except ValueError as exc:
        return f"{what}: {exc}"
    except (EngineDead, EngineNotResponding):
        return None
    except TimeoutError:
        from ui.status import HANG

        HANG.timed_out()
        return f"{what}: the engine did not answer; the change may apply when it resumes."
    except Exception as exc:  # never a traceback in the browser
        log.exception("%s failed", what)
        return f"{what} failed: {exc}"
    return None
