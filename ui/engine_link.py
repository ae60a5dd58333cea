"""The dashboard's link to its engine: the one client every page shares, whether that engine
is alive, hung or dead, and what a page shows when it is not alive.

Owns the ``st.cache_resource`` singleton of engine.process.client.EngineClient (one engine
process per Streamlit server, shut down when the cache entry is released; with config.yaml's
``http_port``, the attached HTTP API of ui/http_sidecar.py beside it), the adapter over the
client's health (``engine_status``: the client's ``status()`` heartbeat where it has one,
otherwise a watchdog thread and the outcome of short calls), the settings and load remembered
across a restart, and the pages a dead engine (with a Restart button) or a hung one (with
Kill and restart) shows before the page stops. Pages get the client only through
``engine_client()``, and meet engine failures only through ``engine_errors`` and
``in_callback``; nothing else in the dashboard constructs a client.

When a restart or a kill is allowed and what a restart puts back is
engine.process.supervision's rule, shared with `engine serve`: a restart is refused whenever
the engine answers (a stale click, another tab restarted it), one runs at a time, and every
restart, kill and refusal is logged with the tab that asked (ui.widgets.tab). While a
restart runs, the clicked button is drawn again, disabled, and a dead page drawn in another
tab names the tab that restarts.

It must never show a traceback (errors become st.error messages; details go to the server
log), never block a page for longer than one short call (UI_CALL_TIMEOUT_S), and never call
st.* from a thread other than the script's. A page that shows trouble stops with
ui.widgets.fragments.stop_page, never st.stop.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import streamlit as st

import engine.envs as envs
from engine.process.client import EngineDead, EngineNotResponding
from engine.process.supervision import (
    Kept,
    RestartRefused,
    check_restart_wanted,
    restart_keeping,
)
from ui.widgets.fragments import in_fragment, live_fragment, stop_page
from ui.widgets.tab import tab_id

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")



def config_path() -> str:
    """The engine's settings file: $GAPLESS_CONFIG, else config.yaml."""
    return str(envs.get(envs.GAPLESS_CONFIG))


def make_client() -> EngineClient:
    """Attach to the engine named by $GAPLESS_ENGINE_SOCKET (an HTTP `serve`, say), else start
    an engine process (the seam tests replace with a fake)."""
    from engine.process.client import EngineClient

    socket_path = envs.get(envs.GAPLESS_ENGINE_SOCKET)
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
        HANG.timed_out()
        return f"{what}: the engine did not answer; the change may apply when it resumes."
    except Exception as exc:  # never a traceback in the browser
        log.exception("%s failed", what)
        return f"{what} failed: {exc}"
    return None



State = Literal["alive", "not_responding", "dead"]
# Every call a page makes waits at most this long: a hung engine must not freeze a page.
UI_CALL_TIMEOUT_S = 2.0
BANNER_PERIOD_S = 1.0


@dataclass(slots=True, frozen=True)
class EngineStatus:
    state: State
    reason: str | None = None  # why not alive


class HangMemo:
    """Whether a call to the engine timed out lately with no answer since (thread-safe).

    Without a heartbeat a hang shows only as calls that time out; once one has, pages skip
    their calls (each would block for UI_CALL_TIMEOUT_S) until a call answers again.
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._since: float | None = None

    def timed_out(self) -> None:
        with self._lock:
            if self._since is None:
                self._since = self._clock()

    def answered(self) -> None:
        with self._lock:
            self._since = None

    def hung_for(self) -> float | None:
        """Seconds since the first unanswered timeout, or None when the engine answers."""
        with self._lock:
            return None if self._since is None else self._clock() - self._since


HANG = HangMemo()

HEARTBEAT_S = 0.5  # the watchdog's probe period
HUNG_AFTER_S = 2.0  # a probe unanswered this long means "not responding"


class Watchdog:
    """A stand-in heartbeat for a client without ``status()``: a daemon thread asks the
    engine for its settings every HEARTBEAT_S (kept in REMEMBERED, which the pages' live
    parts show instead of calling themselves); a question unanswered for HUNG_AFTER_S marks
    the engine not responding at once, without any page waiting on a call. It only ever
    blocks itself. One per client; ``stop()`` ends it (a new client, or tests).
    """

    def __init__(self, client: Any, memo: HangMemo, clock: Any = time.monotonic) -> None:
        self.client = client
        self.memo = memo
        self._clock = clock
        self._stop = threading.Event()
        self._asked: float | None = None  # when the probe in flight was sent
        self._thread = threading.Thread(target=self._run, name="gapless-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def overdue(self) -> bool:
        """A probe has been waiting longer than HUNG_AFTER_S."""
        asked = self._asked
        return asked is not None and self._clock() - asked > HUNG_AFTER_S

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.client.alive():
                self._asked = self._clock()
                try:
                    REMEMBERED.remember(self.client.settings())
                    self.memo.answered()
                except TimeoutError:
                    self.memo.timed_out()
                except Exception:  # dead or broken: alive() and the pages say so
                    pass
                finally:
                    self._asked = None
            self._stop.wait(HEARTBEAT_S)


_watchdogs: dict[int, Watchdog] = {}
_watchdog_lock = threading.Lock()


def watch(client: Any) -> None:
    """Make sure ``client`` (and only it) has a watchdog, when it has no status() of its own."""
    if callable(getattr(client, "status", None)):
        return
    with _watchdog_lock:
        if id(client) in _watchdogs and _watchdogs[id(client)].client is client:
            return
        for old in _watchdogs.values():
            old.stop()
        _watchdogs.clear()
        _watchdogs[id(client)] = Watchdog(client, HANG).start()


def watched(client: Any) -> bool:
    dog = _watchdogs.get(id(client))
    return dog is not None and dog.client is client


def current_settings(client: Any) -> dict[str, Any]:
    """The engine's settings for a live part of a page: the watchdog's latest reading
    (at most HEARTBEAT_S old, no call) when it has one, otherwise a call."""
    if watched(client):
        latest = REMEMBERED.latest()
        if latest:
            return latest
    settings = dict(client.settings())
    REMEMBERED.remember(settings)
    return settings


def stop_watchdogs() -> None:
    with _watchdog_lock:
        for dog in _watchdogs.values():
            dog.stop()
        _watchdogs.clear()


def _overdue(client: Any) -> bool:
    return watched(client) and _watchdogs[id(client)].overdue()


def engine_status(client: Any) -> EngineStatus:
    """The client's own heartbeat verdict when it has ``status()``; else alive() / dead,
    and "not_responding" while a call has timed out with none answered since (HANG) or the
    watchdog's probe has waited longer than HUNG_AFTER_S."""
    status = getattr(client, "status", None)
    if callable(status):
        try:
            state = status()
        except Exception as exc:  # a broken status() must not take the page down
            log.exception("client.status() failed")
            return EngineStatus("not_responding", f"status check failed: {exc}")
        # EngineClient.status() gives an object with .state, .reason and .silent_s (the
        # stand-in in tests/ui gives the state alone).
        name = getattr(state, "state", state)
        reason = getattr(state, "reason", None)
        if name == "dead":
            return EngineStatus("dead", reason or client.death_reason())
        if name == "not_responding":
            silent = getattr(state, "silent_s", None)
            return EngineStatus("not_responding", reason or (
                f"no heartbeat from the engine for {silent:.1f} s" if silent is not None
                else "no heartbeat from the engine for over 2 s"))
        if name == "stalled":  # the process answers; its step loop has not moved
            return EngineStatus("not_responding", reason or "the engine's step loop is stalled")
        return EngineStatus("alive")
    if not client.alive():
        return EngineStatus("dead", client.death_reason())
    hung = HANG.hung_for()
    if hung is not None:
        return EngineStatus("not_responding", f"no answer for {hung + UI_CALL_TIMEOUT_S:.0f} s")
    if _overdue(client):
        return EngineStatus("not_responding", f"no answer for over {HUNG_AFTER_S:g} s")
    return EngineStatus("alive")


REMEMBERED = Kept()  # what a restart puts back; one engine per Streamlit server


# Held from a restart's staleness check until its restart is done: two tabs that saw the same
# engine and click Restart together must not both pass the check before either restart has
# moved the generation. With the lock the second one checks after the first restart.
_RESTART_LOCK = threading.RLock()


class Restarting:
    """Which tab's restart is under way, if any (thread-safe): a dead page drawn meanwhile
    shows its Restart button disabled and says who is restarting the engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: str | None = None

    def begin(self, who: str) -> None:
        with self._lock:
            self._by = who

    def end(self) -> None:
        with self._lock:
            self._by = None

    def by(self) -> str | None:
        with self._lock:
            return self._by


RESTARTING = Restarting()


def _checked(client: EngineClient, who: str, what: str, seen_generation: int | None,
             hung: bool) -> None:
    """engine.process.supervision's check (a kill is refused once the engine answers again,
    as this dashboard reads it), with a refusal logged naming who asked."""
    try:
        check_restart_wanted(client, seen_generation, hung,
                             answers=lambda: engine_status(client).state == "alive")
    except RestartRefused as e:
        log.warning("engine %s asked by %s refused: %s (engine generation %s, seen %s)", what,
                    who, e, getattr(client, "generation", "?"), seen_generation)
        raise


def restart_keeping_settings(client: EngineClient, who: str = "a tab",
                             seen_generation: int | None = None) -> dict[str, Any]:
    """client.restart() of a dead engine, then the live settings it had before (async,
    slots, graphs) and the load generator if it was running. Logged with who asked;
    RestartRefused (logged too) when the engine runs or the view that asked is stale (one
    restart at a time: _RESTART_LOCK)."""
    with _RESTART_LOCK:
        _checked(client, who, "restart", seen_generation, hung=False)
        return _restart(client, who)


def _restart(client: EngineClient, who: str) -> dict[str, Any]:
    log.warning("engine restart asked by %s (engine generation %s, pid %s: %s)", who,
                getattr(client, "generation", "?"), client.pid,
                client.death_reason() or "running")
    RESTARTING.begin(who)
    try:
        settings = restart_keeping(client, REMEMBERED,
                                   origin=f"{who}, putting back the settings after a restart")
    finally:
        RESTARTING.end()
    HANG.answered()
    log.warning("engine restarted for %s (generation %s, pid %s)", who,
                getattr(client, "generation", "?"), client.pid)
    return settings


def kill_and_restart(client: EngineClient, who: str = "a tab",
                     seen_generation: int | None = None) -> None:
    """SIGKILL a hung engine (a SIGSTOPped one cannot answer a shutdown), then restart it.
    RestartRefused, and nothing killed, when the view that asked is stale."""
    with _RESTART_LOCK:
        _kill_and_restart(client, who, seen_generation)


def _kill_and_restart(client: EngineClient, who: str, seen_generation: int | None) -> None:
    _checked(client, who, "kill", seen_generation, hung=True)
    pid = client.pid
    log.warning("engine kill (SIGKILL, pid %s) asked by %s: not responding", pid, who)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5.0
        while client.alive() and time.monotonic() < deadline:
            time.sleep(0.05)  # the client notices the exit within about a second
    _restart(client, who)



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
    except RestartRefused as e:
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
    engine call draws this at the top level (ui/widgets/fragments.py says why)."""
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
    see ui/widgets/fragments.py)."""
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
