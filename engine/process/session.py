"""One connection to an engine process, seen from a client: calls, streams, liveness, death.

Owns the client side of the wire (wire.py): request/reply calls and notifications sent by a
writer thread (a caller never blocks on a full socket of a hung engine), per-request streams
of text and token ids, feeding a local TelemetryBus mirror, the heartbeat that tells a hung
engine (nothing heard for ``not_responding_after_s``) from a stuck step loop (heartbeats say
the loop makes no progress) and from a dead one, and noticing death: within about a second
of the process exiting every in-flight request ends with finish_reason "error" (keeping the
text and token ids that arrived), waiting calls raise EngineDead, and the reason says what
happened ("engine process exited with code -9 (SIGKILL)").

A session is either the owner's (it started the process: spawn.EngineProcess) or attached
(a Unix socket to an engine another client started). Both processes stamp with
time.perf_counter_ns() (CLOCK_MONOTONIC on Linux), so mirrored records compare with the
client's own clock. It must never import streamlit or ui/, and never block a caller forever:
every wait has a timeout, or ends when the engine dies or stops responding.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from engine.core.request import RequestOutput
from engine.process.endpoint import hang_up
from engine.process.spawn import EngineProcess
from engine.process.status import (
    EngineDead,
    EngineError,
    EngineNotResponding,
    EngineStartError,
    EngineStatus,
)
from engine.process.streams import POLL_S, StreamBook
from engine.process.wire import (
    NO_REPLY,
    BenchItem,
    Call,
    Closing,
    Command,
    Delta,
    End,
    Failed,
    Heartbeat,
    Nvml,
    Ready,
    Reply,
    Telemetry,
    decode,
    decode_events,
    decode_steps,
    pickle_frame,
)
from telemetry.bus import TelemetryBus
from telemetry.records import RequestEvent

log = logging.getLogger("gapless.client")

EXIT_GRACE_S = 1.5  # after the pipe closes, how long to wait for the exit code
# What a Python caller can do about a hung engine; status() reasons, which a dashboard or an
# HTTP server shows its own users, state the fact only.
RESTART_ADVICE = "restart() kills it and starts a new one"


class _Call:
    __slots__ = ("event", "ok", "value", "items")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.ok = False
        self.value: Any = None
        self.items: queue.SimpleQueue[Any] | None = None  # run_benchmark's stream of items


class Session:
    """One connection. A client replaces its session on restart(), never reuses one."""

    def __init__(self, conn: Connection, bus: TelemetryBus, *, proc: EngineProcess | None,
                 not_responding_after_s: float, stall_after_s: float) -> None:
        self.conn = conn
        self.bus = bus
        self.proc = proc
        self.pid: int | None = proc.pid if proc is not None else None
        self.not_responding_after_s = not_responding_after_s
        self.stall_after_s = stall_after_s
        self.dead: str | None = None
        self.leaving: str | None = None  # set by this side before it closes: the reason
        self.closing: str | None = None  # the engine's own Closing reason
        self.info: dict[str, Any] = {}
        self.nvml: dict[str, Any] | None = None
        self.nvml_reason: str | None = "NVML not read yet"
        self.last_heard = time.monotonic()
        self.beat = Heartbeat(-1, 0, 0.0)
        self.streams = StreamBook()
        self.lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self._ready = threading.Event()
        self._eof = threading.Event()
        self._failure: str | None = None
        self._out: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        tag = self.pid if self.pid is not None else id(self)
        for target, name in ((self._receive, "recv"), (self._write, "send")):
            threading.Thread(target=target, daemon=True, name=f"gapless-client-{name}-{tag}"
                             ).start()
        if proc is not None:
            threading.Thread(target=self._watch_exit, daemon=True,
                             name=f"gapless-client-wait-{tag}").start()

    def wait_ready(self, timeout: float) -> None:
        """Until the engine's Ready; EngineStartError (the process is killed) otherwise."""
        deadline = time.monotonic() + timeout
        while not self._ready.is_set() and self.dead is None:
            if time.monotonic() > deadline:
                if self.proc is None:
                    reason = (f"the engine did not answer within {timeout:g} s (still loading "
                              "its model? attach with a larger connect_timeout_s)")
                else:
                    self.kill()
                    reason = (f"the engine did not become ready within {timeout:g} s "
                              "(loading the model took too long?); it was stopped")
                self.leaving = reason
                self.mark_dead(reason)
                self.close()
                raise EngineStartError(reason)
            self._ready.wait(0.05)
        if not self._ready.is_set():
            if self.proc is not None:
                self.proc.exited.wait(EXIT_GRACE_S)
            reason = self._failure or self.dead or "the engine closed the connection"
            if self._failure is None:
                reason = f"the engine process died while starting: {reason}"
            self.dead = reason
            raise EngineStartError(reason)
        self.pid = int(self.info.get("pid", self.pid or 0)) or None
        self.last_heard = time.monotonic()

    # ---------------------------------------------------------------------- liveness
    def silent_s(self) -> float:
        silent = time.monotonic() - self.last_heard
        if silent > 1.0 and self.dead is None:
            # Frames waiting unread mean the engine spoke and this process was too busy to
            # read: not the engine's silence.
            try:
                if self.conn.poll(0):
                    return 0.0
            except (OSError, ValueError):
                pass
        return silent

    def status(self) -> EngineStatus:
        silent, beat = self.silent_s(), self.beat
        if self.dead is not None:
            return EngineStatus("dead", self.dead, silent, beat.step, beat.loop_stalled_s)
        if silent > self.not_responding_after_s:
            return EngineStatus("not_responding", self._silence(silent), silent, beat.step,
                                beat.loop_stalled_s)
        if beat.loop_stalled_s > self.stall_after_s:
            return EngineStatus("stalled", (
                f"the engine's step loop has made no progress for {beat.loop_stalled_s:.1f} s "
                f"with {beat.unfinished} requests unfinished (the process still answers)"),
                silent, beat.step, beat.loop_stalled_s)
        return EngineStatus("alive", None, silent, beat.step, beat.loop_stalled_s)

    def _silence(self, silent: float) -> str:
        return (f"the engine process (pid {self.pid}) has sent nothing for {silent:.1f} s, "
                "not even its heartbeat: it is hung or stopped")

    def check(self, limit_s: float | None = None) -> None:
        """EngineDead, or EngineNotResponding when silent for longer than ``limit_s``
        (default: not_responding_after_s)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        silent = self.silent_s()
        if silent > (self.not_responding_after_s if limit_s is None else limit_s):
            raise EngineNotResponding(f"{self._silence(silent)} ({RESTART_ADVICE})", silent)

    # --------------------------------------------------------------------- transport
    def _encode(self, call_id: int, command: Command, kwargs: dict[str, Any]) -> bytes:
        try:
            return pickle_frame(Call(call_id, command, pickle_frame(kwargs)))
        except Exception as e:  # nothing was sent: the caller's input is at fault
            raise ValueError(f"cannot send {command.value!r} to the engine process: {e}") from e

    def notify(self, command: Command, **kwargs: Any) -> None:
        """Send without waiting for an answer (applied in order with every other call)."""
        if self.dead is not None:
            raise EngineDead(self.dead)
        self._out.put(self._encode(NO_REPLY, command, kwargs))

    def begin(self, command: Command, items: bool = False, **kwargs: Any) -> tuple[int, _Call]:
        """Send a call (EngineNotResponding before sending when the engine is known hung)."""
        self.check()
        call_id = next(self._ids)
        data = self._encode(call_id, command, kwargs)
        pending = _Call()
        if items:
            pending.items = queue.SimpleQueue()
        with self.lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self._calls[call_id] = pending
        self._out.put(data)
        return call_id, pending

    def finish_call(self, call: tuple[int, _Call], command: Command, timeout: float) -> Any:
        """The answer; TimeoutError after ``timeout``, EngineNotResponding as soon as the
        engine is known hung, EngineDead when it dies first."""
        call_id, pending = call
        deadline = time.monotonic() + timeout
        while not pending.event.wait(POLL_S):
            try:
                self.check()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the engine did not answer {command.value} within "
                                       f"{timeout:g} s")
            except (EngineNotResponding, TimeoutError):
                with self.lock:
                    self._calls.pop(call_id, None)
                raise
        return self.outcome(pending)

    def call(self, command: Command, timeout: float, **kwargs: Any) -> Any:
        return self.finish_call(self.begin(command, **kwargs), command, timeout)

    @staticmethod
    def outcome(pending: _Call) -> Any:
        if pending.ok:
            return pending.value
        if isinstance(pending.value, EngineDead):
            raise pending.value
        kind, message = pending.value
        if kind == "ValueError":
            raise ValueError(message)
        raise EngineError(message)

    def _write(self) -> None:
        while True:
            data = self._out.get()
            if data is None:
                return
            try:
                self.conn.send_bytes(data)
            except (OSError, ValueError):  # closed: the receiver's EOF tells the reason
                return

    # ---------------------------------------------------------------- receiver thread
    def _receive(self) -> None:
        while True:
            try:
                frame = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # an unpicklable message must not kill the receiver
                if self.conn.closed:  # closed here while reading
                    break
                log.exception("could not read a message from the engine")
                continue
            self.last_heard = time.monotonic()
            for raw in frame if isinstance(frame, list) else [frame]:
                try:
                    self._dispatch(decode(raw))
                except Exception:
                    log.exception("bad message from the engine: %r", raw[:1])
        self._eof.set()
        self.mark_dead(self._reason_at_eof())

    def _reason_at_eof(self) -> str:
        if self.leaving is not None:
            return self.leaving
        if self.proc is None:
            return self.closing or (f"the connection to the engine process (pid {self.pid}) "
                                    "closed without a word (killed?)")
        if self.proc.exited.wait(EXIT_GRACE_S):
            return self._failure or self.proc.exit_reason()
        self.proc.kill()
        return "the engine process closed its connection but did not exit (it was killed)"

    def _watch_exit(self) -> None:
        assert self.proc is not None
        self.proc.exited.wait()
        # Normally EOF follows at once; should something else hold the pipe open, the exit
        # itself is the death.
        if not self._eof.wait(0.5):
            self.mark_dead(self.leaving or self._failure or self.proc.exit_reason())

    def _dispatch(self, msg: Any) -> None:
        match msg:
            case Delta(rid, text, token_ids):
                s = self.streams.get(rid)
                if s is not None:
                    s.add(text, token_ids)
            case End(rid, out):
                s = self.streams.get(rid)
                if s is not None:
                    s.finish(RequestOutput(**out))
            case Telemetry(steps, events):
                for rec in decode_steps(steps):
                    self.bus.publish_step(rec)
                for ev in decode_events(events):
                    self.bus.publish_event(ev)
            case Heartbeat():
                self.beat = msg
            case Reply(call_id, ok, value):
                with self.lock:
                    pending = self._calls.pop(call_id, None)
                if pending is not None:
                    pending.ok, pending.value = ok, value
                    pending.event.set()
                    if pending.items is not None:
                        pending.items.put(None)
            case BenchItem(call_id, item):
                with self.lock:
                    pending = self._calls.get(call_id)
                if pending is not None and pending.items is not None:
                    pending.items.put(item)
            case Nvml(reading):
                self.nvml = reading
            case Ready(info):
                self.info = info
                self.nvml_reason = info.get("nvml_reason")
                self._ready.set()
            case Failed(message):
                self._failure = str(message)
            case Closing(reason):
                self.closing = reason
            case _:
                log.warning("unknown message from the engine: %r", type(msg))

    def mark_dead(self, reason: str) -> None:
        """First caller wins. Ends every stream and wakes every waiting call."""
        with self.lock:
            if self.dead is not None:
                return
            # Its requests end here, on the mirror, before the death shows: a reader that
            # sees the engine dead has them all (a request's own events come from the
            # engine's pump, every 50 ms, and may never have left it).
            t = time.perf_counter_ns()
            for rid in self.streams.open_ids():
                self.bus.publish_event(RequestEvent(rid, "finished", t, reason="engine_dead"))
            self.dead = reason
            calls, self._calls = list(self._calls.values()), {}
        self._out.put(None)
        if self.leaving is None:
            log.error("engine process %s: %s", self.pid, reason)
        self.streams.end_all(reason)
        for pending in calls:
            pending.ok, pending.value = False, EngineDead(reason)
            pending.event.set()
            if pending.items is not None:
                pending.items.put(None)

    # ------------------------------------------------------------------------ stopping
    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def shutdown(self, timeout: float, grace_s: float) -> None:
        """The owner stops the engine: politely while it answers, SIGKILL when it is hung
        (after ``grace_s``) or does not exit within ``timeout``."""
        assert self.proc is not None
        if self.dead is None:
            self.leaving = "the engine was shut down"
            hung = self.status().state == "not_responding"
            if not hung:
                try:
                    self.call(Command.SHUTDOWN, timeout)
                except (EngineDead, TimeoutError, EngineError):
                    hung = True  # EngineNotResponding is a TimeoutError
            if not self.proc.wait(grace_s if hung else timeout):
                log.warning("engine process %s did not exit: killing it", self.pid)
        self.kill()
        self.proc.wait(5.0)
        self.mark_dead(self.leaving or "the engine was shut down")
        self.close()

    def detach(self, timeout: float) -> None:
        """An attached client leaves; the engine serves on (and aborts what it had open)."""
        if self.dead is None:
            self.leaving = "this client detached from the engine"
            try:
                self.call(Command.DETACH, timeout)
            except (EngineDead, TimeoutError, EngineError, ValueError):
                pass
        self.mark_dead(self.leaving or "this client detached from the engine")
        self.close()

    def close(self) -> None:
        """Hang up, let the receiver finish, then free the descriptor: closing it under a
        receiver that is between two reads of one frame could hand it the next connection's
        bytes once the number is reused."""
        hang_up(self.conn)
        self._eof.wait(2.0)
        self.conn.close()
