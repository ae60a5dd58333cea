"""How long an EngineClient waits, and for what: the limits, validated once, and a wait's check.

Owns the client's time limits (docs/engine-client-api.md: start, each call's answer, the
silence that makes an engine "not responding", a step loop without progress that makes it
"stalled", the silence after which a wait gives up, shutdown, attach) and the check that a
wait on a request or a benchmark runs between its slices. A limit that is not a number of
seconds > 0 is refused here, before any process starts.

It never waits, sleeps or touches a connection itself: session.py and streams.py do the
waiting and call the check.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0
NOT_RESPONDING_AFTER_S = 2.0
STALL_AFTER_S = 10.0
GIVE_UP_AFTER_S = 30.0
KILL_GRACE_S = 1.0  # how long shutdown() waits for a hung engine before SIGKILL
CONNECT_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """The limits a client keeps for its whole life (every session after a restart too)."""

    call_timeout_s: float = CALL_TIMEOUT_S
    not_responding_after_s: float = NOT_RESPONDING_AFTER_S
    stall_after_s: float = STALL_AFTER_S
    give_up_after_s: float = GIVE_UP_AFTER_S

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{f.name} must be a number of seconds > 0, got {value!r}")
            object.__setattr__(self, f.name, float(value))

    def liveness(self) -> dict[str, float]:
        """What a Session needs to tell a hung engine from a stalled one."""
        return {"not_responding_after_s": self.not_responding_after_s,
                "stall_after_s": self.stall_after_s}

    def wait_check(self, session: Any, timeout: float | None,
                   what: str) -> Callable[[float], None]:
        """A wait's check, called with the wait's start: TimeoutError("<what> within
        <timeout> s") after ``timeout``; EngineNotResponding (from ``session.check``) once
        the engine has been silent for give_up_after_s; nothing once it is dead (the wait
        then ends with the request's own end)."""
        give_up = self.give_up_after_s

        def check(t0: float) -> None:
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{what} within {timeout:g} s")
            if session.dead is None:
                session.check(give_up)
        return check
