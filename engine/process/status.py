"""What a client can be told about its engine: the errors it raises and its status value.

Owns EngineDead, EngineStartError, EngineError, EngineNotResponding and EngineStatus, the
vocabulary of docs/engine-client-api.md for "the engine is gone / would not start / failed
a command / does not answer". Plain values only: no threads, no sockets, no engine imports.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

State = Literal["alive", "stalled", "not_responding", "dead"]


class EngineDead(RuntimeError):
    """The engine process is not running (or this client left it); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EngineStartError(EngineDead):
    """The engine process could not start (bad model, out of memory, timeout...)."""


class EngineError(RuntimeError):
    """An engine command failed for a reason other than bad input (that is ValueError)."""


class EngineNotResponding(TimeoutError):
    """The engine process has sent nothing (not even its heartbeat) for longer than the
    client's ``not_responding_after_s``: it is hung or stopped. ``status()`` says more and
    ``restart()`` kills it and starts a new one. ``request_id`` is set when a submit() was
    sent but not confirmed: that request was aborted (see the API doc)."""

    def __init__(self, message: str, silent_s: float, request_id: str | None = None) -> None:
        super().__init__(message)
        self.silent_s = silent_s
        self.request_id = request_id


class EngineStatus(NamedTuple):
    """``state``: "alive"; "stalled" (the process answers, but its step loop has made no
    progress for ``loop_stalled_s`` with requests unfinished); "not_responding" (nothing
    heard for ``silent_s``, above the client's threshold); "dead" (``reason`` says why).
    ``reason`` is None only when alive."""

    state: State
    reason: str | None
    silent_s: float  # since the last message from the engine process
    step: int  # the step loop's step counter at the last heartbeat (-1 before one)
    loop_stalled_s: float
