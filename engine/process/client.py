"""EngineClient: the engine in its own process, seen from the dashboard (or any script).

Owns the public API of docs/engine-client-api.md over a Session (session.py: the
connection, streams, the telemetry mirror, liveness and death). A client either owns the
engine process (it started it; shutdown() ends it) or is attached to one another client
started with ``listen=`` (``EngineClient.attach(path)``; shutdown() only detaches).

It must never import streamlit or ui/, never leave an engine process behind (shutdown() is
idempotent and also runs at interpreter exit, and the engine exits when its owner dies), and
never wait forever: calls fail fast once the engine is known not to respond, and streams give
up after ``give_up_after_s`` of silence.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.config import EngineConfig, SamplingParams
from engine.core.request import RequestOutput
from engine.process import endpoint
from engine.process import timeouts as limits
from engine.process.endpoint import default_socket_path  # noqa: F401 (API)
from engine.process.forkserver import start_engine_process
from engine.process.session import Session
from engine.process.spawn import EngineProcess, exit_reason, last_words  # noqa: F401
from engine.process.status import (  # noqa: F401  (re-exported: they belong to the API)
    EngineDead,
    EngineError,
    EngineNotResponding,
    EngineStartError,
    EngineStatus,
)
from engine.process.streams import KEEP_FINISHED, Follower, RequestStream, next_item
from engine.process.wire import Command
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
    The config, ``listen`` and the time limits (timeouts.py) are validated here (ValueError)
    before any process starts.
    """

    def __init__(self, config_path: str | Path | None = "config.yaml", *,
                 listen: str | Path | None = None,
                 start_timeout_s: float = limits.START_TIMEOUT_S,
                 call_timeout_s: float = limits.CALL_TIMEOUT_S,
                 not_responding_after_s: float = limits.NOT_RESPONDING_AFTER_S,
                 stall_after_s: float = limits.STALL_AFTER_S,
                 give_up_after_s: float = limits.GIVE_UP_AFTER_S, **overrides: Any) -> None:
        if config_path is None:
            self.config: EngineConfig | None = EngineConfig.from_dict({}, **overrides)
        else:
            self.config = EngineConfig.from_yaml(config_path, **overrides)
        self.listen_path = None if listen is None else endpoint.check_listen_path(listen)
        self._setup(limits.Timeouts(call_timeout_s, not_responding_after_s, stall_after_s,
                             give_up_after_s), start_timeout_s)
        self._start()
        _live.add(self)

    @classmethod
    def attach(cls, path: str | Path, *, call_timeout_s: float = limits.CALL_TIMEOUT_S,
               not_responding_after_s: float = limits.NOT_RESPONDING_AFTER_S,
               stall_after_s: float = limits.STALL_AFTER_S,
               give_up_after_s: float = limits.GIVE_UP_AFTER_S,
               connect_timeout_s: float = limits.CONNECT_TIMEOUT_S) -> EngineClient:
        """A client of the engine another EngineClient started with ``listen=path``. Same
        API; it sees its own requests' deltas and all telemetry; shutdown() detaches.
        ValueError when nothing listens there; EngineStartError when the engine refuses."""
        self = cls.__new__(cls)
        self.config = None
        self.listen_path = Path(path).expanduser().absolute()
        self._setup(limits.Timeouts(call_timeout_s, not_responding_after_s, stall_after_s,
                             give_up_after_s), connect_timeout_s)
        self._start()
        _live.add(self)
        return self

    def _setup(self, timeouts: limits.Timeouts, start_timeout_s: float) -> None:
        self.timeouts = timeouts
        self.start_timeout_s = start_timeout_s
        self._bus = TelemetryBus()
        # Ids this client picks are its own: a random tag keeps two clients of one engine
        # (and the engine's own "req-N") apart.
        self._rid_prefix = f"req-{secrets.token_hex(3)}"
        self._rids = itertools.count()
        self._lifecycle = threading.Lock()
        self._closed = False
        self._session: Session | None = None
        self._dead_reason: str | None = None
        self.generation = 0  # bumped by every start: which engine process a view saw

    @property
    def attached(self) -> bool:
        """True for a client made by attach() (it does not own the engine process)."""
        return self.config is None

    def _start(self) -> None:
        self.generation += 1
        self._bus = TelemetryBus()
        liveness = self.timeouts.liveness()
        try:
            if self.attached:
                assert self.listen_path is not None
                sock = endpoint.connect(self.listen_path, self.start_timeout_s)
                session = Session(Connection(sock.detach()), self._bus, proc=None, **liveness)
            else:
                assert self.config is not None
                proc = start_engine_process(self.listen_path, self.config.device)
                session = Session(proc.conn, self._bus, proc=proc, **liveness)
                session.notify(Command.START, config=self.config.to_dict())
            session.wait_ready(self.start_timeout_s)
        except EngineStartError as e:
            self._session = None
            self._dead_reason = e.reason
            raise
        self._session = session

    def _live_session(self) -> Session:
        s = self._session
        if s is None:
            raise EngineDead(self._dead_reason or "the engine is not running")
        s.check()
        return s

    # ---------------------------------------------------------------------- lifecycle
    @property
    def pid(self) -> int | None:
        """The engine process id (None when it never started)."""
        return self._session.pid if self._session is not None else None

    def alive(self) -> bool:
        """Not dead (a hung engine is alive but not responding(): see status())."""
        s = self._session
        return s is not None and s.dead is None

    def responding(self) -> bool:
        """Alive and heard from within ``not_responding_after_s`` (its heartbeat: 0.5 s)."""
        return self.status().state in ("alive", "stalled")

    def status(self) -> EngineStatus:
        """state "alive" | "stalled" | "not_responding" | "dead", with a reason."""
        s = self._session
        if s is None:
            return EngineStatus("dead", self._dead_reason or "the engine is not running",
                                0.0, -1, 0.0)
        return s.status()

    def death_reason(self) -> str | None:
        """None while alive; otherwise why the engine is not running."""
        s = self._session
        if s is None:
            return self._dead_reason or "the engine is not running"
        return s.dead

    def restart(self) -> None:
        """Owner: stop the engine process (SIGKILL at once if it is not responding) and start
        a new one with the same config. Attached: connect again to the same socket. The
        telemetry mirror starts empty (step numbers restart at 0)."""
        with self._lifecycle:
            old = self._session
            self._stop(10.0)
            self._closed = False
            self._start()
            if old is not None and self._session is not None:
                # Requests of the old process (all ended by now) stay readable.
                self._session.streams.adopt(old.streams)

    def shutdown(self, timeout: float = limits.SHUTDOWN_TIMEOUT_S) -> None:
        """Owner: stop the engine process (idempotent); in-flight requests end "abort",
        attached clients are told. A hung engine is killed after about a second. Attached:
        detach; the engine serves on and aborts this client's requests still open."""
        with self._lifecycle:
            if self._closed:
                return
            self._closed = True
            self._stop(timeout)

    def _stop(self, timeout: float) -> None:
        s = self._session
        if s is None:
            return
        if self.attached:
            s.detach(min(timeout, 5.0))
        else:
            s.shutdown(timeout, limits.KILL_GRACE_S)
        self._dead_reason = s.dead

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _call(self, command: Command, timeout: float | None = None, **kwargs: Any) -> Any:
        return self._live_session().call(
            command, self.timeouts.call_timeout_s if timeout is None else timeout, **kwargs)

    # ----------------------------------------------------------------------- requests
    def submit(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
               request_id: str | None = None) -> str:
        """Queue a request; returns its id. ValueError carries the engine's message.
        When the engine does not confirm in time (TimeoutError / EngineNotResponding, with
        ``.request_id``), the request is aborted: nothing of it runs unseen."""
        s = self._live_session()
        rid = request_id if request_id is not None else f"{self._rid_prefix}-{next(self._rids)}"
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"request_id must be a non-empty string, got {rid!r}")
        stream = s.streams.open(rid)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            stream.prompt_token_ids = list(prompt)
        try:
            call = s.begin(Command.SUBMIT, prompt=prompt, params=params, request_id=rid)
        except BaseException:  # not sent
            s.streams.forget(stream)
            raise
        try:
            answer = s.finish_call(call, Command.SUBMIT, self.timeouts.call_timeout_s)
            if isinstance(answer, dict) and not stream.prompt_token_ids:
                stream.prompt_token_ids = list(answer.get("prompt_token_ids") or [])
        except TimeoutError as e:  # sent, unconfirmed: the abort follows it in order
            message = f"{e}; request {rid} was aborted"
            try:
                s.notify(Command.ABORT, request_id=rid)
            except EngineDead:
                pass
            stream.end_here("abort", message)
            err = (EngineNotResponding(message, e.silent_s, rid)
                   if isinstance(e, EngineNotResponding) else TimeoutError(message))
            err.request_id = rid  # type: ignore[attr-defined]
            raise err from None
        except BaseException:
            s.streams.forget(stream)
            raise
        if s.dead is not None:  # died between the reply and here: the stream ends too
            stream.end_here("error", s.dead)
        return rid

    def _waiting(self, rid: str, timeout: float | None,
                 what: str) -> tuple[RequestStream, Callable[[float], None]]:
        """The request's stream, and the check its wait runs (timeouts.Timeouts.wait_check)."""
        s = self._session
        stream = s.streams.get(rid) if s is not None else None
        if s is None or stream is None:
            raise ValueError(f"unknown request id {rid!r} (not submitted through this client, "
                             f"or read long ago: it keeps the last {KEEP_FINISHED} read)")
        return stream, self.timeouts.wait_check(s, timeout, f"request {rid} {what}")

    def stream(self, rid: str, timeout: float | None = None) -> Iterator[str]:
        """Text deltas until the request ends (for any reason, engine death included).
        ``timeout`` bounds the wait for each delta (TimeoutError); without it, the wait ends
        with EngineNotResponding once the engine has been silent for give_up_after_s."""
        stream, check = self._waiting(rid, timeout, "sent nothing")
        return stream.iter_deltas(check)

    def stream_counted(self, rid: str, timeout: float | None = None
                       ) -> Iterator[tuple[str, int]]:
        """As stream(), each delta with the request's output token count so far (this
        delta's tokens included): what a usage figure on every chunk needs."""
        stream, check = self._waiting(rid, timeout, "sent nothing")
        return stream.iter_counted(check)

    def follow(self, rid: str, wake: Callable[[], None]) -> Follower:
        """The request for a reader on an event loop, with no thread waiting on it: ``wake()``
        is called (on the client's receiver thread: it must only schedule, never block)
        whenever a delta or the end arrives; Follower.take() then returns them. The reader
        runs Follower.check between waits (it raises once the engine has been silent for
        give_up_after_s) and calls Follower.close() when it stops reading."""
        stream, check = self._waiting(rid, None, "sent nothing")
        return Follower(stream, wake, check)

    def result(self, rid: str, timeout: float | None = None) -> RequestOutput:
        """The request's output once it has ended; finish_reason "error" (and error set,
        text and token_ids as far as they arrived) when the engine died first.
        TimeoutError when ``timeout`` passes first; EngineNotResponding when the engine has
        been silent for give_up_after_s (the request may still finish later)."""
        stream, check = self._waiting(rid, timeout, "did not finish")
        return stream.wait(check)

    def generate(self, prompt: str | list[int], params: SamplingParams | dict | None = None,
                 timeout: float | None = None) -> RequestOutput:
        """submit() then result(): one request, start to end."""
        return self.result(self.submit(prompt, params), timeout)

    def abort(self, rid: str) -> None:
        """Ask the engine to end ``rid`` with "abort". Returns at once: it is a message that
        applies in order, after everything this client sent before and before anything it
        sends after, at the engine's next step boundary (a request that ended first keeps
        its own end). It never times out; sent to a hung engine, it applies when the engine
        resumes. Unknown ids are ignored by the engine."""
        if not isinstance(rid, str):
            raise ValueError(f"request_id must be a string, got {rid!r}")
        s = self._session
        if s is None:
            raise EngineDead(self._dead_reason or "the engine is not running")
        s.notify(Command.ABORT, request_id=rid)

    # ------------------------------------------------------------------- live control
    def configure(self, async_batching: bool | None = None, num_slots: int | None = None,
                  cuda_graphs: bool | None = None, *, expect_version: int | None = None,
                  origin: str | None = None,
                  sentinel_sample_every: int | None = None,
                  max_num_batched_tokens: int | None = None) -> dict[str, Any]:
        """Change live settings (``sentinel_sample_every``: the async-correctness sentinel,
        0 off, N = re-score 1 in N finished greedy requests; ``max_num_batched_tokens``: the
        token budget of a step, within settings()["max_num_batched_tokens_range"]).
        ``expect_version`` (a settings()["settings_version"] seen earlier) makes it a
        compare-and-set: if the settings changed since, nothing is applied and the answer has
        ``refused``. ``origin`` names the asker in the log."""
        extra = {k: v for k, v in (("expect_version", expect_version), ("origin", origin),
                                   ("sentinel_sample_every", sentinel_sample_every),
                                   ("max_num_batched_tokens", max_num_batched_tokens))
                 if v is not None}
        return dict(self._call(Command.CONFIGURE, async_batching=async_batching,
                               num_slots=num_slots, cuda_graphs=cuda_graphs, **extra))

    def settings(self) -> dict[str, Any]:
        return dict(self._call(Command.SETTINGS))

    def stats(self) -> dict[str, Any]:
        return dict(self._call(Command.STATS))

    def record_anatomy(self, n_steps: int = 8, timeout_s: float = 30.0) -> dict[str, Any]:
        """Record the kernels of the next n_steps steps in the engine process: the dict of
        engine.instruments.anatomy.anatomy_summary (per-step timing, family table, Chrome trace)."""
        return dict(self._call(Command.RECORD_ANATOMY, timeout=timeout_s + 30.0,
                               n_steps=n_steps, timeout_s=timeout_s))

    def process_info(self) -> dict[str, Any]:
        """pid, parent pid, whether streamlit / ui were imported in the engine process,
        listen (the socket path or None), clients (connected now), owner (this client)."""
        return dict(self._call(Command.PROCESS_INFO))

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
        return dict(self._call(Command.START_LOAD, spec=spec))

    def stop_load(self) -> dict[str, Any]:
        """Stop the load generator and abort its requests still in flight."""
        return dict(self._call(Command.STOP_LOAD))

    def load_running(self) -> bool:
        return bool(self.load_stats()["running"])

    def load_stats(self) -> dict[str, Any]:
        """running, submitted, finished, inflight, dropped, errors, stopped_reason, spec."""
        return dict(self._call(Command.LOAD_STATS))

    # --------------------------------------------------------------------- benchmark
    def run_benchmark(self, spec: Any) -> Iterator[Any]:
        """Yields BenchmarkProgress and one BenchmarkResult per mode (engine/workload.py).
        ValueError when the engine is busy or the spec is bad; EngineDead if it dies;
        EngineNotResponding after give_up_after_s of silence. Stopping the iteration early
        cancels the run in the engine process."""
        s = self._live_session()
        call_id, pending = s.begin(Command.RUN_BENCHMARK, items=True, spec=spec)
        finished = False
        try:
            assert pending.items is not None
            check = self.timeouts.wait_check(s, None, "the benchmark")
            while (item := next_item(pending.items, check)) is not None:
                yield item
            finished = True
            s.outcome(pending)
        finally:
            if not finished and s.dead is None:
                try:
                    s.notify(Command.CANCEL_BENCHMARK)
                except EngineDead:
                    pass
