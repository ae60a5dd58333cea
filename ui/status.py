"""Is the engine alive, hung or dead, and what does it run: one answer for every page.

Owns the adapter over the engine client's health (``engine_status``: the client's
``status()`` heartbeat where it has one, otherwise ``alive()`` / ``death_reason()`` and the
outcome of a short call), the settings remembered across a restart, and the restart itself:
one at a time, refused when the view that asked is stale (a plain restart whenever the
engine runs), every refusal logged with the tab, the settings and load generator put back
under that tab's name, and which tab's restart is under way (RESTARTING) for the other
tabs' dead pages.

It must never block a page for longer than one short call (UI_CALL_TIMEOUT_S), and never
call st.* from a thread other than the script's.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engine.process.client import EngineClient

log = logging.getLogger("gapless.ui")

State = Literal["alive", "not_responding", "dead"]
# Every call a page makes waits at most this long: a hung engine must not freeze a page.
UI_CALL_TIMEOUT_S = 2.0
BANNER_PERIOD_S = 1.0
LIVE_KEYS = ("async_batching", "num_slots", "cuda_graphs", "sentinel_sample_every")


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


class Remembered:
    """The engine's settings as last seen (thread-safe): what the pages show without a
    call of their own while the watchdog reads them, and what a restart puts back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.settings: dict[str, Any] = {}
        self.full: dict[str, Any] = {}
        self.load: dict[str, Any] | None = None

    def remember(self, settings: dict[str, Any]) -> None:
        """Keep ``settings`` unless they are older than the ones kept (same engine process,
        lower settings version: a slow reading that lost a race with a change)."""
        with self._lock:
            old = self.full
            if (old.get("engine_pid") is not None
                    and old.get("engine_pid") == settings.get("engine_pid")
                    and settings.get("settings_version", 0) < old.get("settings_version", 0)):
                return
            self.full = dict(settings)
            self.settings = {k: settings[k] for k in (*LIVE_KEYS, "cuda_graphs_available")
                             if k in settings}

    def latest(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.full)

    def remember_load(self, stats: dict[str, Any]) -> None:
        """The load generator as last seen: its spec while it runs (a restart starts it
        again with that spec), None once stopped."""
        with self._lock:
            self.load = dict(stats["spec"]) if stats.get("running") and stats.get("spec") \
                else None

    def load_spec(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self.load is None else dict(self.load)

    def live(self) -> dict[str, Any]:
        with self._lock:
            s = dict(self.settings)
        if not s.get("cuda_graphs_available"):
            s.pop("cuda_graphs", None)  # cannot be turned on here anyway
        return {k: s[k] for k in LIVE_KEYS if k in s}


REMEMBERED = Remembered()  # one engine per Streamlit server (ui/client.py)


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


class StaleRestart(Exception):
    """A restart asked from a view of an engine that is no longer the current one, or of a
    hang that has ended: nothing was done (the message says why)."""


def check_restart_wanted(client: EngineClient, seen_generation: int | None,
                         hung: bool) -> None:
    """Raise StaleRestart when the view that asked is stale. A plain restart (of a dead
    engine) is refused whenever the engine runs: another tab restarted it (whatever
    generation the asking view was drawn with: a view drawn during that restart already
    carries the new one), or it never died. A kill is refused once the engine the view saw
    was restarted, or when it answers again."""
    now = getattr(client, "generation", None)
    moved = seen_generation is not None and now is not None and now != seen_generation
    if not hung and client.alive():
        raise StaleRestart("the engine is running" + (
            " (another tab or client restarted it)" if moved else ""))
    if moved:
        # Restarted since, or restarting now (the generation moves when a start begins).
        raise StaleRestart("the engine was already restarted by another tab or client" + (
            " and is running" if client.alive() else "; its start is under way"))
    if hung and engine_status(client).state == "alive":
        raise StaleRestart("the engine answers again; nothing was killed")


def _checked(client: EngineClient, who: str, what: str, seen_generation: int | None,
             hung: bool) -> None:
    """check_restart_wanted, with a refusal logged naming who asked."""
    try:
        check_restart_wanted(client, seen_generation, hung)
    except StaleRestart as e:
        log.warning("engine %s asked by %s refused: %s (engine generation %s, seen %s)", what,
                    who, e, getattr(client, "generation", "?"), seen_generation)
        raise


def restart_keeping_settings(client: EngineClient, who: str = "a tab",
                             seen_generation: int | None = None) -> dict[str, Any]:
    """client.restart() of a dead engine, then the live settings it had before (async,
    slots, graphs) and the load generator if it was running. Logged with who asked;
    StaleRestart (logged too) when the engine runs or the view that asked is stale (one
    restart at a time: _RESTART_LOCK)."""
    with _RESTART_LOCK:
        _checked(client, who, "restart", seen_generation, hung=False)
        return _restart(client, who)


def _restart(client: EngineClient, who: str) -> dict[str, Any]:
    log.warning("engine restart asked by %s (engine generation %s, pid %s: %s)", who,
                getattr(client, "generation", "?"), client.pid,
                client.death_reason() or "running")
    live = REMEMBERED.live()
    load = REMEMBERED.load_spec()
    RESTARTING.begin(who)
    try:
        client.restart()
    finally:
        RESTARTING.end()
    HANG.answered()
    settings = client.settings()
    origin = f"{who}, putting back the settings after a restart"
    if live:
        try:
            settings = dict(client.configure(**live, origin=origin))
        except ValueError:  # e.g. graphs no longer available: keep what the engine allows
            live.pop("cuda_graphs", None)
            settings = (dict(client.configure(**live, origin=origin)) if live
                        else client.settings())
    REMEMBERED.remember(settings)
    if load is not None:
        from engine.drivers.loadgen import LoadSpec

        try:
            client.start_load(LoadSpec(**load))
        except Exception:  # the engine runs; the user can start the load again
            log.exception("restoring the load generator after a restart failed")
    log.warning("engine restarted for %s (generation %s, pid %s)", who,
                getattr(client, "generation", "?"), client.pid)
    return settings


def kill_and_restart(client: EngineClient, who: str = "a tab",
                     seen_generation: int | None = None) -> None:
    """SIGKILL a hung engine (a SIGSTOPped one cannot answer a shutdown), then restart it.
    StaleRestart, and nothing killed, when the view that asked is stale."""
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
