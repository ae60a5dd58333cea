"""When an engine that is dead or hung may be restarted, how fast restarts may follow one
another, and what a restart keeps: the one policy `python -m engine serve`
(engine/serving/supervise.py) and the dashboard (ui/engine_link.py) share.

- A restart is refused whenever the engine answers (``check_restart_wanted``, raising
  RestartRefused with the reason): a restart of an engine that runs (a stale view; another
  tab or client restarted it), and a kill of a hung engine that answers again or was
  restarted since the view that asked was drawn (the client's ``generation`` names the
  engine process a view saw).
- Restarts after deaths back off (``Backoff``): 1, 2, 4... s between failed attempts, at most
  MAX_BACKOFF_S, and more than ``max_restarts`` deaths within ``window_s`` is a crash loop
  that is given up. A person's click on Restart is not backed off: the page shows them the
  death's reason first.
- A restart keeps the engine's config (EngineClient.restart starts the same one) and puts
  back what was changed live (``Kept``, ``restart_keeping``): the live settings of
  engine.config.LIVE_SETTINGS as last seen (CUDA graphs only where the new engine has them,
  the token budget only where it lies in the new engine's range) and the load generator
  with the spec it ran.

Pure policy over a client object: it never imports torch or streamlit (the dashboard imports
it: tests/test_layering.py), and never kills or restarts anything unless asked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from engine.config import LIVE_SETTINGS

log = logging.getLogger("gapless.supervision")

MAX_BACKOFF_S = 30.0


class RestartRefused(Exception):
    """A restart or kill asked of an engine that answers, or from a view of an engine that
    is no longer the current one: nothing was done (the message says why)."""


def check_restart_wanted(client: Any, seen_generation: int | None = None, hung: bool = False,
                         answers: Callable[[], bool] | None = None) -> None:
    """Raise RestartRefused unless a restart (``hung``: a kill, then a restart) may go ahead.

    A plain restart (of a dead engine) is refused whenever the engine runs: someone else
    restarted it (whatever generation the asking view was drawn with: a view drawn during
    that restart already carries the new one), or it never died. A kill is refused once the
    engine the view saw (``seen_generation``) was restarted, or when it answers again
    (``answers()``, the asker's own reading of the engine's health)."""
    now = getattr(client, "generation", None)
    moved = seen_generation is not None and now is not None and now != seen_generation
    if not hung and client.alive():
        raise RestartRefused("the engine is running" + (
            " (another tab or client restarted it)" if moved else ""))
    if moved:
        # Restarted since, or restarting now (the generation moves when a start begins).
        raise RestartRefused("the engine was already restarted by another tab or client" + (
            " and is running" if client.alive() else "; its start is under way"))
    if hung and answers is not None and answers():
        raise RestartRefused("the engine answers again; nothing was killed")


class Backoff:
    """Deaths seen and the waits before restart attempts: ``died()`` is False once more
    than ``max_restarts`` deaths fall within ``window_s`` (a crash loop: give up);
    ``delays()`` are the waits before each of up to ``max_restarts`` attempts, doubling from
    ``backoff_s`` to at most MAX_BACKOFF_S."""

    def __init__(self, max_restarts: int = 5, backoff_s: float = 1.0, window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_restarts < 1:
            raise ValueError(f"--max-engine-restarts must be >= 1, got {max_restarts}")
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.window_s = window_s
        self._clock = clock
        self.deaths: deque[float] = deque()

    def died(self) -> bool:
        """Count a death now; whether restarting is still allowed."""
        now = self._clock()
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.window_s:
            self.deaths.popleft()
        return len(self.deaths) <= self.max_restarts

    def delays(self) -> Iterator[float]:
        delay = self.backoff_s
        for _ in range(self.max_restarts):
            yield delay
            delay = min(2 * delay, MAX_BACKOFF_S)


def kept_live_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The live settings of ``settings`` (an engine's settings() answer) a restart puts
    back; CUDA graphs only where that engine had them available."""
    live = {k: settings[k] for k in LIVE_SETTINGS if k in settings}
    if not settings.get("cuda_graphs_available"):
        live.pop("cuda_graphs", None)  # cannot be turned on there anyway
    return live


class Kept:
    """What a restart puts back, as last seen (thread-safe): the engine's settings and the
    load generator's spec while it runs. The dashboard also shows these settings instead of
    calling a hung engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.full: dict[str, Any] = {}
        self.load: dict[str, Any] | None = None

    def remember(self, settings: Mapping[str, Any]) -> None:
        """Keep ``settings`` unless they are older than the ones kept (same engine process,
        lower settings version: a slow reading that lost a race with a change)."""
        with self._lock:
            old = self.full
            if (old.get("engine_pid") is not None
                    and old.get("engine_pid") == settings.get("engine_pid")
                    and settings.get("settings_version", 0) < old.get("settings_version", 0)):
                return
            self.full = dict(settings)

    def latest(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.full)

    def remember_load(self, stats: Mapping[str, Any]) -> None:
        """The load generator as last seen (an engine's stats()): its spec while it runs,
        None once stopped."""
        with self._lock:
            self.load = dict(stats["spec"]) if stats.get("running") and stats.get("spec") \
                else None

    def load_spec(self) -> dict[str, Any] | None:
        with self._lock:
            return None if self.load is None else dict(self.load)

    def live(self) -> dict[str, Any]:
        with self._lock:
            return kept_live_settings(self.full)

    def forget(self) -> None:
        with self._lock:
            self.full = {}
            self.load = None


def fitting(live: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The kept ``live`` settings an engine whose settings() answer is ``settings`` takes:
    a token budget outside its max_num_batched_tokens_range (an engine started with a
    smaller max_num_batched_tokens) stays at the engine's own."""
    out = dict(live)
    budget, span = out.get("max_num_batched_tokens"), settings.get("max_num_batched_tokens_range")
    if budget is not None and span is not None and not span[0] <= budget <= span[1]:
        log.warning("the kept token budget %s is outside the restarted engine's range %s; "
                    "it keeps its own", budget, list(span))
        out.pop("max_num_batched_tokens")
    return out


def restart_keeping(client: Any, kept: Kept, origin: str) -> dict[str, Any]:
    """``client.restart()``, then the live settings and the load generator ``kept`` had
    (``origin`` names the asker in the engine's log); the new engine's settings. Settings
    the new engine refuses (graphs no longer available, a budget outside its range) are left
    at its own."""
    live = kept.live()
    load = kept.load_spec()
    client.restart()
    settings = dict(client.settings())
    live = fitting(live, settings)
    if live:
        try:
            settings = dict(client.configure(**live, origin=origin))
        except ValueError:  # e.g. graphs no longer available: keep what the engine allows
            live.pop("cuda_graphs", None)
            settings = (dict(client.configure(**live, origin=origin)) if live
                        else dict(client.settings()))
    kept.remember(settings)
    if load is not None:
        from engine.drivers.loadgen import LoadSpec

        try:
            client.start_load(LoadSpec(**load))
        except Exception:  # the engine runs; the load can be started again by hand
            log.exception("restoring the load generator after a restart failed")
    return settings
