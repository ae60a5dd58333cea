"""The engine process as seen from the parent: starting it, the pipe, calls and streams.

Owns the parent side of the wire (the protocol is in engine/server.py): starting the engine
as a fresh interpreter and waiting until its model is loaded, request/reply calls, per-request
streams of text deltas, feeding a local TelemetryBus mirror, and noticing death: within about
a second of the process exiting every in-flight request ends with finish_reason "error",
waiting calls raise EngineDead, and the reason says what happened ("engine process exited
with code -9 (SIGKILL)").

The engine starts through subprocess rather than multiprocessing's spawn context (spawn
semantics: nothing is inherited but one socket), because spawn re-runs the parent's __main__
in the child, and under `streamlit run` that imports streamlit in the engine process. Both
processes stamp with time.perf_counter_ns() (CLOCK_MONOTONIC on Linux, shared by all
processes), so mirrored records compare with the dashboard's own clock.

It must never import streamlit or ui/ and never block a caller forever (every wait has a
timeout or ends when the engine dies). engine/client.py builds the public API on it.
"""


from __future__ import annotations

import itertools
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.core.request import RequestOutput
from engine.process.server import decode_events, decode_steps
from telemetry.bus import TelemetryBus

log = logging.getLogger("gapless.client")

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300.0
CALL_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0
# After the pipe closes, how long to wait for the exit code before calling it a hang.
EXIT_GRACE_S = 1.5
KEEP_FINISHED = 1024  # finished requests whose result() can still be read
MAX_OUTPUT_CHARS = 300


# "Fatal Python error: ...", or the last line of a traceback ("RuntimeError: ...").
_ERROR_LINE = re.compile(r"(Fatal Python error|[\w.]*(Error|Exception|Interrupt))\b")


def last_words(lines: list[str]) -> str | None:
    """The line of a dying process's output that says most: its latest error line (for
    a crash, faulthandler's "Fatal Python error: ..." comes before the stacks)."""
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else None


def _pickle(obj: Any) -> bytes:
    # What Connection.send does, split out so a pickling error is told apart from a
    # broken pipe.
    return bytes(ForkingPickler.dumps(obj))


class EngineDead(RuntimeError):
    """The engine process is not running; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EngineStartError(EngineDead):
    """The engine process could not start (bad model, out of memory, timeout...)."""


class EngineError(RuntimeError):
    """An engine command failed for a reason other than bad input (that is ValueError)."""


def exit_reason(code: int | None, last_output: str | None = None) -> str:
    """What a user reads when the engine process is gone. The process's last line of
    output is added when it says something (a Python error, "Fatal Python error: ..."),
    not after SIGKILL or SIGTERM, where it is just whatever was logged last."""
    if code is None:
        return "the engine process closed its connection but did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        reason = f"engine process exited with code {code} ({name})"
        if -code in (signal.SIGKILL, signal.SIGTERM):
            return reason
    else:
        reason = f"engine process exited with code {code}"
    if code != 0 and last_output:
        reason += f"; its last output: {last_output[:MAX_OUTPUT_CHARS]}"
    return reason


class _Stream:
    """One request's deltas and end, as the receiver thread delivers them."""

    __slots__ = ("request_id", "deltas", "done", "output", "text")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.deltas: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.done = threading.Event()
        self.output: RequestOutput | None = None
        self.text = ""

    def finish(self, output: RequestOutput) -> None:
        if self.done.is_set():
            return
        self.output = output
        self.done.set()
        self.deltas.put(None)


class _Call:
    __slots__ = ("event", "ok", "value", "items")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.ok = False
        self.value: Any = None
        self.items: queue.SimpleQueue[Any] | None = None  # run_benchmark's stream of items


class _Session:
    """One engine process and its pipe. restart() replaces the session, never reuses it."""

    def __init__(self, config: EngineConfig, bus: TelemetryBus, start_timeout_s: float) -> None:
        self.bus = bus
        self.dead: str | None = None
        self.shutting_down = False
        self.info: dict[str, Any] = {}
        self.nvml: dict[str, Any] | None = None
        self.nvml_reason: str | None = "NVML not read yet"
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self.streams: OrderedDict[str, _Stream] = OrderedDict()
        self._ready = threading.Event()
        self._eof = threading.Event()
        self._exited = threading.Event()
        self._start_failure: str | None = None

        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        fd = child_sock.fileno()
        try:
            self.proc = subprocess.Popen(
                # -P: never put the working directory first on sys.path, so `engine`
                # is this repository's package whatever folder the parent runs in.
                [sys.executable, "-P", "-c", "from engine.process.server import main; main()",
                 "--fd", str(fd), "--parent", str(os.getpid())],
                pass_fds=(fd,), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
            )
        finally:
            child_sock.close()  # only the child holds its end: its exit gives us EOF
        self.pid = self.proc.pid
        self.conn = Connection(parent_sock.detach())
        self.last_output: deque[str] = deque(maxlen=200)  # a crash dumps every stack
        threading.Thread(target=self._relay_stderr, daemon=True,
                         name=f"gapless-client-stderr-{self.pid}").start()
        self._receiver = threading.Thread(target=self._receive, daemon=True,
                                          name=f"gapless-client-recv-{self.pid}")
        self._waiter = threading.Thread(target=self._wait_exit, daemon=True,
                                        name=f"gapless-client-wait-{self.pid}")
        self._receiver.start()
        self._waiter.start()
        try:
            self._send(0, "start", {"config": config.to_dict()})
        except EngineDead:
            pass  # the child died at once: the reason comes below
        deadline = time.monotonic() + start_timeout_s
        while not self._ready.is_set() and self.dead is None:
            if time.monotonic() > deadline:
                self.kill()
                raise EngineStartError(
                    f"the engine did not become ready within {start_timeout_s:g} s "
                    "(loading the model took too long?); it was stopped"
                )
            self._ready.wait(0.05)
        if not self._ready.is_set():
            self._exited.wait(EXIT_GRACE_S)
            reason = self._start_failure or self.dead or self._exit_reason()
            if self._start_failure is None:
                reason = f"the engine process died while starting: {reason}"
            self.dead = reason
            raise EngineStartError(reason)

    # --------------------------------------------------------------------- transport
    def _send(self, call_id: int, command: str, kwargs: dict[str, Any]) -> None:
        # The arguments are pickled apart from the envelope, so the engine can always read
        # the call id and answer, even when it cannot rebuild an argument.
        try:
            data = _pickle((call_id, command, _pickle(kwargs)))
        except Exception as e:  # nothing was sent: the caller's input is at fault
            raise ValueError(f"cannot send {command!r} to the engine process: {e}") from e
        try:
            with self._send_lock:
                self.conn.send_bytes(data)
        except (OSError, ValueError) as e:
            raise EngineDead(self.dead or f"the engine's pipe is closed ({e})") from e

    def call(self, command: str, timeout: float | None, items: bool = False,
             **kwargs: Any) -> Any:
        call = self.begin(command, items, **kwargs)
        return self.finish_call(call, command, timeout)

    def begin(self, command: str, items: bool = False, **kwargs: Any) -> tuple[int, _Call]:
        if self.dead is not None:
            raise EngineDead(self.dead)
        call_id = next(self._ids)
        pending = _Call()
        if items:
            pending.items = queue.SimpleQueue()
        with self._lock:
            if self.dead is not None:
                raise EngineDead(self.dead)
            self._calls[call_id] = pending
        try:
            self._send(call_id, command, kwargs)
        except BaseException:
            with self._lock:
                self._calls.pop(call_id, None)
            raise
        return call_id, pending

    def finish_call(self, call: tuple[int, _Call], command: str, timeout: float | None) -> Any:
        call_id, pending = call
        if not pending.event.wait(timeout):
            with self._lock:
                self._calls.pop(call_id, None)
            raise TimeoutError(f"the engine did not answer {command} within {timeout:g} s")
        return self.outcome(pending)

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

    # ---------------------------------------------------------------- receiver thread
    def _receive(self) -> None:
        while True:
            try:
                batch = self.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:  # an unpicklable message must not kill the receiver
                log.exception("could not read a message from the engine")
                continue
            for msg in batch if isinstance(batch, list) else [batch]:
                try:
                    self._dispatch(msg)
                except Exception:
                    log.exception("bad message from the engine: %r", msg[:1])
        self._eof.set()
        if self._exited.wait(EXIT_GRACE_S):
            self.mark_dead(self._exit_reason())
        else:
            reason = exit_reason(None)
            self.kill()
            self.mark_dead(reason)

    def _relay_stderr(self) -> None:
        """The engine's log goes on to our stderr; its last lines explain a crash."""
        assert self.proc.stderr is not None
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for raw in self.proc.stderr:
            try:
                if out is not None:
                    out.write(raw)
                    out.flush()
                else:
                    sys.stderr.write(raw.decode(errors="replace"))
            except (OSError, ValueError):  # our stderr is closed: keep draining the pipe
                pass
            line = raw.decode(errors="replace").strip()
            if line:
                self.last_output.append(line.rsplit("\r", 1)[-1])
        self.proc.stderr.close()

    def _wait_exit(self) -> None:
        self.proc.wait()
        self._exited.set()
        # Normally EOF follows at once; should something else hold the pipe open, the exit
        # itself is the death.
        if not self._eof.wait(0.5):
            self.mark_dead(self._exit_reason())

    def _exit_reason(self) -> str:
        if self.shutting_down:
            return "the engine was shut down"
        if self._start_failure:
            return self._start_failure
        code = self.proc.returncode
        if code:  # a crash prints on its way out: give the relay a moment to catch it
            time.sleep(0.1)
        return exit_reason(code, last_words(list(self.last_output)))

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "delta":
            _, rid, text = msg
            s = self.streams.get(rid)
            if s is not None:
                s.text += text
                s.deltas.put(text)
        elif kind == "end":
            _, rid, out = msg
            s = self.streams.get(rid)
            if s is not None:
                s.finish(RequestOutput(**out))
        elif kind == "telemetry":
            _, steps, events = msg
            for rec in decode_steps(steps):
                self.bus.publish_step(rec)
            for ev in decode_events(events):
                self.bus.publish_event(ev)
        elif kind == "reply":
            _, call_id, ok, value = msg
            with self._lock:
                pending = self._calls.pop(call_id, None)
            if pending is not None:
                pending.ok, pending.value = ok, value
                pending.event.set()
                if pending.items is not None:
                    pending.items.put(None)
        elif kind == "bench":
            _, call_id, item = msg
            with self._lock:
                pending = self._calls.get(call_id)
            if pending is not None and pending.items is not None:
                pending.items.put(item)
        elif kind == "nvml":
            _, reading, reason = msg
            self.nvml, self.nvml_reason = reading, reason
        elif kind == "ready":
            self.info = msg[1]
            self.nvml_reason = self.info.get("nvml_reason")
            self._ready.set()
        elif kind == "failed":
            self._start_failure = str(msg[1])
        else:
            log.warning("unknown message from the engine: %r", kind)

    def mark_dead(self, reason: str) -> None:
        """First caller wins. Ends every stream and wakes every waiting call."""
        with self._lock:
            if self.dead is not None:
                return
            self.dead = reason
            calls, self._calls = list(self._calls.values()), {}
        if not self.shutting_down:
            log.error("engine process %d: %s", self.pid, reason)
        for s in list(self.streams.values()):
            s.finish(RequestOutput(s.request_id, [], [], s.text, "error", reason))
        for pending in calls:
            pending.ok, pending.value = False, EngineDead(reason)
            pending.event.set()
            if pending.items is not None:
                pending.items.put(None)

    # ------------------------------------------------------------------------ stopping
    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def shutdown(self, timeout: float) -> None:
        if self.dead is not None:
            self.kill()
            self.conn.close()
            return
        self.shutting_down = True
        try:
            self.call("shutdown", timeout)
        except (EngineDead, TimeoutError, EngineError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("engine process %d did not exit in %g s: killing it", self.pid, timeout)
            self.kill()
            self.proc.wait(5.0)
        self.mark_dead("the engine was shut down")
        self.conn.close()
