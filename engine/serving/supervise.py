"""What `serve` does when its engine process dies: restart it, exit, or stay up answering 503.

Owns the engine-death policy of `python -m engine serve --on-engine-death`:

    restart : start the engine again with the same settings (EngineClient.restart), waiting
              1, 2, 4... s between attempts (``backoff_s`` doubling, at most 30 s); after
              ``max_restarts`` failed attempts in a row, or that many deaths within
              ``window_s``, give up and exit (a crash loop is a supervisor's business).
              A serve attached to another process's engine (serve --attach) cannot start
              it: it re-attaches once the engine's owner (the dashboard) has restarted it,
              trying every ``reattach_period_s`` for as long as it serves
    exit    : stop serving and exit with EXIT_ENGINE_DIED, so a supervisor (systemd,
              Kubernetes) acts
    stay    : keep serving: /health and every request answer 503 with the reason until
              someone restarts the engine (the dashboard does, with its Restart button)

When a restart is allowed (never while the engine answers), its backoff and what it keeps
(the live settings and load generator last seen, read every KEEP_PERIOD_S while the engine
runs) are engine.process.supervision's policy, which the dashboard's Restart button follows
too. Every decision is printed on stderr. Meanwhile /health and /ready say what is happening
through ``app.state.engine_note``. It never touches HTTP requests: the client's own death
handling ends them (error events, 503s). A hung engine (not responding) is not dead: it is
the silence handling's business (serve --engine-timeout), not this one's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.process.supervision import (
    Backoff,
    Kept,
    RestartRefused,
    check_restart_wanted,
    restart_keeping,
)

POLICIES = ("restart", "exit", "stay")
EXIT_ENGINE_DIED = 3
KEEP_PERIOD_S = 1.0  # how often a running engine's settings and load are read for a restart


def say(message: str) -> None:
    print(f"gapless: {message}", file=sys.stderr, flush=True)


class EngineSupervisor:
    """A daemon thread that watches ``client.alive()`` and applies ``policy``.
    ``stop_serving(code)`` ends the HTTP server with that exit code; ``note(text)`` sets what
    /health adds to its 503."""

    def __init__(self, client: Any, policy: str, *, stop_serving: Callable[[int], None],
                 note: Callable[[str | None], None], max_restarts: int = 5,
                 backoff_s: float = 1.0, window_s: float = 300.0, poll_s: float = 0.2,
                 reattach_period_s: float = 1.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"--on-engine-death must be one of {', '.join(POLICIES)}, "
                             f"got {policy!r}")
        self.backoff = Backoff(max_restarts, backoff_s, window_s)
        self.client = client
        self.policy = policy
        self.stop_serving = stop_serving
        self.note = note
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.poll_s = poll_s
        self.reattach_period_s = reattach_period_s
        self.kept = Kept()
        self._kept_at = -KEEP_PERIOD_S
        self.restarts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name="gapless-engine-supervisor")

    def start(self) -> EngineSupervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.client.alive():
                self._keep()
                continue
            reason = self.client.death_reason() or "the engine is not running"
            if self._stop.is_set():  # serve is shutting down the engine itself
                return
            if self.policy == "stay":
                say(f"the engine died ({reason}); serving 503s until it is restarted "
                    "(--on-engine-death stay)")
                self.note("--on-engine-death stay: restart it from the dashboard or restart "
                          "serve")
                while not self._stop.wait(self.poll_s) and not self.client.alive():
                    pass
                self.note(None)
                continue
            if self.policy == "exit":
                say(f"the engine died ({reason}); exiting with code {EXIT_ENGINE_DIED} "
                    "(--on-engine-death exit)")
                self.note("serve is exiting (--on-engine-death exit)")
                self.stop_serving(EXIT_ENGINE_DIED)
                return
            if getattr(self.client, "attached", False):
                if not self._reattach(reason):
                    return
            elif not self._restart(reason):
                return

    def _keep(self) -> None:
        """Read what a restart puts back, at most every KEEP_PERIOD_S (an attached serve
        restarts nothing: the engine's owner keeps its own)."""
        now = time.monotonic()
        if self.policy != "restart" or getattr(self.client, "attached", False) \
                or now - self._kept_at < KEEP_PERIOD_S:
            return
        self._kept_at = now
        try:
            self.kept.remember(self.client.settings())
            self.kept.remember_load(self.client.load_stats())
        except Exception:  # died or busy meanwhile: the last reading stands
            pass

    def _reattach(self, reason: str) -> bool:
        """Connect again to the engine's socket once its owner has restarted it; False when
        serve stops first."""
        where = getattr(self.client, "listen_path", None) or "its socket"
        say(f"the engine died ({reason}); this serve is attached to it and cannot start it: "
            f"re-attaching to {where} once its owner restarts it, trying every "
            f"{self.reattach_period_s:g} s")
        self.note("waiting for the engine's owner to restart it")
        while not self._stop.wait(self.reattach_period_s):
            try:
                self.client.restart()
            except Exception:  # nothing listens there yet
                continue
            self.restarts += 1
            self.note(None)
            say(f"re-attached to the engine (pid {self.client.pid})")
            return True
        return False

    def _restart(self, reason: str) -> bool:
        """Restart with backoff; False (after stop_serving) when it gives up."""
        if not self.backoff.died():
            say(f"the engine died ({reason}), {len(self.backoff.deaths)} times within "
                f"{self.window_s:g} s; giving up, exiting with code {EXIT_ENGINE_DIED}")
            self.stop_serving(EXIT_ENGINE_DIED)
            return False
        for attempt, delay in enumerate(self.backoff.delays(), start=1):
            say(f"the engine died ({reason}); restarting it with the same settings in "
                f"{delay:g} s, attempt {attempt} of {self.max_restarts} "
                "(--on-engine-death restart)")
            self.note(f"restarting it: attempt {attempt} of {self.max_restarts}")
            if self._stop.wait(delay):
                return False
            try:
                check_restart_wanted(self.client)
            except RestartRefused as e:  # someone else restarted it meanwhile
                say(f"no restart: {e}")
                self.note(None)
                return True
            try:
                restart_keeping(self.client, self.kept,
                                origin="serve, putting back the settings after a restart")
            except Exception as e:  # EngineStartError, or it died again while starting
                reason = getattr(e, "reason", None) or f"{type(e).__name__}: {e}"
                continue
            self.restarts += 1
            self.note(None)
            say(f"the engine runs again (pid {self.client.pid}), restart {self.restarts}")
            return True
        say(f"the engine could not be restarted ({reason}) after {self.max_restarts} "
            f"attempts; exiting with code {EXIT_ENGINE_DIED}")
        self.stop_serving(EXIT_ENGINE_DIED)
        return False
