"""EngineClient: the engine in its own process, seen from the dashboard (or any script).

Owns the public API of docs/engine-client-api.md over a _Session (engine/session.py: the
process, the pipe, streams, the telemetry mirror, death detection). It must never import
streamlit or ui/, and never leave an engine process behind: shutdown() is idempotent and
also runs at interpreter exit, and the engine exits when this process dies.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, SamplingParams
from engine.core.request import RequestOutput
from engine.process.session import (  # noqa: F401  (re-exported: the errors belong to the API)
    CALL_TIMEOUT_S,
    KEEP_FINISHED,
    SHUTDOWN_TIMEOUT_S,
    START_TIMEOUT_S,
    EngineDead,
    EngineError,
    EngineStartError,
    _Session,
    _Stream,
    exit_reason,
    last_words,
)
from telemetry.bus import TelemetryBus

log = logging.getLogger("gapless.client")

_live: weakref.WeakSet[EngineClient] = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    for client in list(_live):
        try:
            client.shutdown(timeout=10.0)
        except Exception:  # exiting anyway; the engine also exits when we are gone
            log.exception("engine shutdown at exit failed")


class EngineClient:
    """The engine in a child process. See docs/engine-client-api.md for the contract.

    ``config_path`` None means EngineConfig defaults; ``overrides`` are EngineConfig keys.
    The config is validated here (ValueError) before any process starts.
    """

    def __init__(self, config_path: str | Path | None = "config.yaml", *,
                 start_timeout_s: float = START_TIMEOUT_S,
                 call_timeout_s: float = CALL_TIMEOUT_S, **overrides: Any) -> None:
        if config_path is None:
            self.config = EngineConfig.from_dict({}, **overrides)
        else:
            self.config = EngineConfig.from_yaml(config_path, **overrides)
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self._bus = TelemetryBus()
        self._rids = itertools.count()
        self._lifecycle = threading.Lock()
        self._closed = False
        self._session: _Session | None = None
        self._dead_reason: str | None = None
        self._start()
        _live.add(self)

    def _start(self) -> None:
        self._bus = TelemetryBus()
        try:
            self._session = _Session(self.config, self._bus, self.start_timeout_s)
        except EngineStartError as e:
            self._session = None
            self._dead_reason = e.reason
            raise

    def _live_session(self) -> _Session:
        s = self._session
        if s is None:
            raise EngineDead(self._dead_reason or "the engine is not running")
        if s.dead is not None:
            raise EngineDead(s.dead)
        return s

    # ---------------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> int | None:
        """The engine process id (None when it never started)."""
        return self._session.pid if self._session is not None else None

    def alive(self) -> bool:
        s = self._session
        return s is not None and s.dead is None

    def death_reason(self) -> str | None:
        """None while alive; otherwise why the engine is not running."""
        s = self._session
        if s is None:
            return self._dead_reason or "the engine is not running"
        return s.dead

    def restart(self) -> None:
        """Stop the current engine process (if any) and start a new one with the same
        config. The telemetry mirror starts empty (step numbers restart at 0)."""
        with self._lifecycle:
            if self._session is not None:
                self._session.shutdown(timeout=10.0)
            self._closed = False
            self._start()

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop the engine process (idempotent). In-flight requests end with "abort"."""
        with self._lifecycle:
            if self._closed:
                return
            self._closed = True
            if self._session is not None:
                self._session.shutdown(timeout)
                self._dead_reason = self._session.dead

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _call(self, command: str, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._live_session().call(
            command, self.call_timeout_s if timeout is None else timeout, **kwargs)

    # ----------------------------------------------------------------------- requests
    def submit(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
               request_id: str | None = None) -> str:
        """Queue a request; returns its id. ValueError carries the engine's message."""
        s = self._live_session()
        rid = request_id if request_id is not None else f"req-{next(self._rids)}"
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"request_id must be a non-empty string, got {rid!r}")
        stream = _Stream(rid)
        with s._lock:
            old = s.streams.get(rid)
            if old is not None and not old.done.is_set():
                raise ValueError(f"request id {rid!r} is already in use")
            s.streams[rid] = stream
            s.streams.move_to_end(rid)
            self._prune(s)
        try:
            s.call("submit", self.call_timeout_s, prompt=prompt, params=params, request_id=rid)
        except BaseException:
            with s._lock:
                if s.streams.get(rid) is stream:
                    del s.streams[rid]
            raise
        if s.dead is not None:  # died between the reply and here: the stream ends too
            stream.finish(RequestOutput(rid, [], [], stream.text, "error", s.dead))
        return rid

    @staticmethod
    def _prune(s: _Session) -> None:
        extra = len(s.streams) - KEEP_FINISHED
        for rid in list(s.streams):
            if extra <= 0:
                break
            if s.streams[rid].done.is_set():
                del s.streams[rid]
                extra -= 1

    def _stream_of(self, rid: str) -> _Stream:
        s = self._session
        stream = s.streams.get(rid) if s is not None else None
        if stream is None:
            raise ValueError(f"unknown request id {rid!r} (not submitted through this client, "
                             "or from before a restart)")
        return stream

    def stream(self, rid: str, timeout: float | None = None) -> Iterator[str]:
        """Text deltas until the request ends (for any reason, engine death included).
        ``timeout`` bounds the wait for each delta (TimeoutError)."""
        stream = self._stream_of(rid)
        while True:
            try:
                delta = stream.deltas.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {rid} sent nothing for {timeout:g} s") from None
            if delta is None:
                stream.deltas.put(None)  # a second stream() ends at once too
                return
            yield delta

    def result(self, rid: str, timeout: float | None = None) -> RequestOutput:
        """The request's output once it has ended; finish_reason "error" (and error set)
        when the engine died first. TimeoutError when ``timeout`` passes first."""
        stream = self._stream_of(rid)
        if not stream.done.wait(timeout):
            raise TimeoutError(f"request {rid} did not finish within {timeout:g} s")
        assert stream.output is not None
        return stream.output

    def generate(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
                 timeout: float | None = None) -> RequestOutput:
        """submit() then result(): one request, start to end."""
        return self.result(self.submit(prompt, params), timeout)

    def abort(self, rid: str) -> None:
        self._call("abort", request_id=rid)

    # ------------------------------------------------------------------- live control
    def configure(self, async_batching: bool | None = None, num_slots: int | None = None,
                  cuda_graphs: bool | None = None) -> dict[str, Any]:
        return dict(self._call("configure", async_batching=async_batching,
                               num_slots=num_slots, cuda_graphs=cuda_graphs))

    def settings(self) -> dict[str, Any]:
        return dict(self._call("settings"))

    def record_anatomy(self, n_steps: int = 8, timeout_s: float = 30.0) -> dict[str, Any]:
        """Record the kernels of the next n_steps steps in the engine process: the dict of
        engine.step.anatomy.anatomy_summary (per-step timing, family table, Chrome trace)."""
        return dict(self._call("record_anatomy", timeout=timeout_s + 30.0, n_steps=n_steps,
                               timeout_s=timeout_s))

    def stats(self) -> dict[str, int]:
        return dict(self._call("stats"))

    def process_info(self) -> dict[str, Any]:
        """pid, parent pid, and whether streamlit / ui were imported in the engine process."""
        return dict(self._call("process_info"))

    # ---------------------------------------------------------------------- telemetry
    def telemetry(self) -> TelemetryBus:
        """The local mirror of the engine's bus (a new one after restart())."""
        return self._bus

    def nvml(self) -> dict[str, Any] | None:
        """The latest NvmlReading as a dict (telemetry.nvml field names), or None."""
        s = self._session
        return s.nvml if s is not None else None

    def nvml_reason(self) -> str | None:
        """None while NVML readings arrive; otherwise why not ("no GPU: ...")."""
        s = self._session
        if s is None:
            return "the engine is not running"
        return None if s.nvml is not None else s.nvml_reason

    # ---------------------------------------------------------------- load generator
    def start_load(self, spec: Any) -> dict[str, Any]:
        """Start (or replace) the load generator in the engine process; returns its stats."""
        return dict(self._call("start_load", spec=spec))

    def stop_load(self) -> dict[str, Any]:
        """Stop the load generator and abort its requests still in flight."""
        return dict(self._call("stop_load"))

    def load_running(self) -> bool:
        return bool(self._call("load_running"))

    def load_stats(self) -> dict[str, Any]:
        """running, submitted, finished, inflight, dropped, errors, stopped_reason, spec."""
        return dict(self._call("load_stats"))

    # --------------------------------------------------------------------- benchmark
    def run_benchmark(self, spec: Any) -> Iterator[Any]:
        """Yields BenchmarkProgress and one BenchmarkResult per mode (engine/workload.py).
        ValueError when the engine is busy or the spec is bad; EngineDead if it dies.
        Stopping the iteration early cancels the run in the engine process."""
        s = self._live_session()
        call_id, pending = s.begin("run_benchmark", items=True, spec=spec)
        finished = False
        try:
            assert pending.items is not None
            while True:
                item = pending.items.get()
                if item is None:
                    break
                yield item
            finished = True
            s.outcome(pending)
        finally:
            if not finished and s.dead is None:
                try:
                    s.call("cancel_benchmark", self.call_timeout_s)
                except (EngineDead, TimeoutError):
                    pass

