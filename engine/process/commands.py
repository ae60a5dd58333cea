"""What the engine process does for a command: the Engine, load generator and benchmark calls.

Owns the command side of EngineServer (server.py holds the connections and asks a Commands
for what to run: ``table``, ``start_benchmark``, ``stop_drivers``): submitting with
callbacks that route a request's deltas and end to the client that submitted it, aborts,
live settings, the load generator and the benchmark, and refusing what would disturb a
running benchmark. Callbacks run on the step loop's thread and only put a message into a
client's queue; nothing here sends on a connection or waits on a client.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from engine.process.links import ClientLink
from engine.process.wire import BenchItem, Command, Reply, delta_raw, describe, end_raw

log = logging.getLogger("gapless.server")


class _TokenCursor:
    """The token ids of one request not sent yet. Called on the step loop's thread right
    after a token is appended, so the request's list is consistent when read."""

    __slots__ = ("engine", "request", "sent")

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.request: Any = None
        self.sent = 0

    def take(self, request_id: str) -> list[int]:
        if self.request is None:
            self.request = self.engine.output_token_ids(request_id)
            if self.request is None:
                return []
        ids = self.request
        new = ids[self.sent:]
        self.sent = len(ids)
        return new


class Commands:
    """What each command does. ``process_info`` is the server's (it knows the connections
    and the NVML sampler); the rest needs only the engine."""

    def __init__(self, engine: Any,
                 process_info: Callable[[ClientLink], dict[str, Any]]) -> None:
        self.engine = engine
        self.lock = threading.RLock()  # serialises state changes across clients
        self.load: Any = None  # engine.drivers.loadgen.LoadGenerator while one exists
        self.bench: threading.Thread | None = None
        self.bench_cancel = threading.Event()
        self.table: dict[Command, Callable[..., Any]] = {
            Command.SUBMIT: self.submit,
            Command.ABORT: self.abort,
            Command.CONFIGURE: self.configure,
            Command.SETTINGS: lambda link: self.with_benchmark(engine.settings()),
            Command.STATS: lambda link: engine.stats(),
            Command.START_LOAD: self.start_load,
            Command.STOP_LOAD: self.stop_load,
            Command.LOAD_STATS: lambda link: self.load_stats(),
            Command.PROCESS_INFO: process_info,
            Command.RECORD_ANATOMY: self.record_anatomy,
            Command.CANCEL_BENCHMARK: lambda link: self.bench_cancel.set(),
        }

    def record_anatomy(self, link: ClientLink, n_steps: int = 8,
                       timeout_s: float = 30.0) -> dict[str, Any]:
        """Kernels of the next n_steps steps (engine.instruments.anatomy); the server runs it on a
        thread of its own, so it blocks no client's other commands."""
        from engine.instruments.anatomy import anatomy_summary, record_anatomy

        return anatomy_summary(record_anatomy(self.engine, n_steps, timeout_s))

    def with_benchmark(self, settings: dict[str, Any]) -> dict[str, Any]:
        """The engine's settings as clients get them: plus whether a benchmark runs, and the
        engine process's id (a restarted engine is a new process: tabs tell them apart)."""
        return {**settings, "benchmark_running": self.benchmark_running(),
                "engine_pid": os.getpid()}

    def benchmark_running(self) -> bool:
        """A benchmark started by any client is running (every client's settings say so)."""
        return self.bench is not None and self.bench.is_alive()

    def _refuse_during_benchmark(self, what: str) -> None:
        if self.benchmark_running():
            raise ValueError(f"a benchmark is running; {what} once it has finished")

    # ------------------------------------------------------------------------ requests
    def submit(self, link: ClientLink, prompt: Any, params: Any = None,
               request_id: str | None = None) -> str:
        self._refuse_during_benchmark("submit requests")
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        outbox = link.outbox
        tokens = _TokenCursor(self.engine)
        if request_id is not None:
            link.open.add(request_id)
        try:
            handle = self.engine.submit(
                prompt, params, request_id=request_id,
                on_delta=lambda rid, text: outbox.put(delta_raw(rid, text, tokens.take(rid))),
                on_finish=lambda out: outbox.put(end_raw(out.request_id, dataclasses.asdict(out))),
            )
        except BaseException:
            if request_id is not None:
                link.open.discard(request_id)
            raise
        # The prompt's token ids go back with the id: the client keeps them, so a request
        # ended by the engine's death still says what its prompt was.
        return {"request_id": str(handle.request_id),
                "prompt_token_ids": list(getattr(handle, "prompt_token_ids", []))}

    def abort(self, link: ClientLink, request_id: str) -> None:
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a string, got {request_id!r}")
        self.engine.abort(request_id)

    def configure(self, link: ClientLink, expect_version: int | None = None,
                  origin: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """Apply a settings change. With ``expect_version`` it is a compare-and-set: the
        change applies only if the engine's settings are still at that version (the one the
        asking view showed); otherwise nothing changes and the answer, the settings in force,
        carries ``refused`` with the reason. Every change is logged with who asked."""
        who = origin or "a client"
        with self.lock:
            self._refuse_during_benchmark("change settings")
            now = self.engine.settings_version
            if expect_version is not None and expect_version != now:
                log.info("settings change %s by %s refused: made on version %s, the engine "
                         "is at version %s", kwargs, who, expect_version, now)
                return {**self.with_benchmark(self.engine.settings()), "refused": (
                    f"the settings changed (version {expect_version} -> {now}) before this "
                    "change arrived, so it was not applied; the page shows the engine's "
                    "settings now")}
            after = self.with_benchmark(self.engine.configure(**kwargs))
            if after["settings_version"] != now:
                log.info("settings version %d by %s: %s", after["settings_version"], who,
                         {k: v for k, v in kwargs.items() if v is not None})
            return after

    # ------------------------------------------------------------------ load generator
    def start_load(self, link: ClientLink, spec: Any) -> dict[str, Any]:
        from engine.drivers.loadgen import LoadGenerator, LoadSpec

        with self.lock:
            self._refuse_during_benchmark("start the load generator")
            if not isinstance(spec, LoadSpec):
                raise ValueError(
                    f"start_load needs an engine.drivers.loadgen.LoadSpec, got {spec!r}")
            gen = LoadGenerator(self.engine, spec)  # validates before the old one is stopped
            if self.load is not None:
                self.load.stop()
            self.load = gen.start()
            return self.load_stats()

    def stop_load(self, link: ClientLink) -> dict[str, Any]:
        with self.lock:
            if self.load is not None:
                self.load.stop()
            return self.load_stats()

    def load_running(self) -> bool:
        return bool(self.load is not None and self.load.running)

    def load_stats(self) -> dict[str, Any]:
        if self.load is None:
            return {"running": False, "submitted": 0, "finished": 0, "inflight": 0,
                    "dropped": 0, "errors": 0, "stopped_reason": None, "spec": None}
        return {**self.load.stats(), "spec": dataclasses.asdict(self.load.spec)}

    # ----------------------------------------------------------------------- benchmark
    def start_benchmark(self, link: ClientLink, call_id: int, spec: Any) -> None:
        with self.lock:
            try:
                self._refuse_during_benchmark("start another")
                if self.load_running():
                    raise ValueError("the load generator is running; stop it before a benchmark")
            except ValueError as e:
                link.put(Reply(call_id, False, ("ValueError", str(e))))
                return
            self.bench_cancel = threading.Event()
            self.bench = threading.Thread(target=self._benchmark, args=(link, call_id, spec),
                                          name="gapless-bench", daemon=True)
            self.bench.start()

    def _benchmark(self, link: ClientLink, call_id: int, spec: Any) -> None:
        from engine.drivers.workload import BenchmarkSpec, run_benchmark

        try:
            if not isinstance(spec, BenchmarkSpec):
                raise ValueError(f"run_benchmark needs an engine.drivers.workload.BenchmarkSpec,"
                                 f" got {spec!r}")
            for item in run_benchmark(self.engine, spec, cancel=self.bench_cancel):
                if link.gone.is_set():  # its client left: nobody would read the result
                    self.bench_cancel.set()
                link.put(BenchItem(call_id, item))
        except Exception as e:
            if not isinstance(e, ValueError):
                log.exception("benchmark failed")
            link.put(Reply(call_id, False, (type(e).__name__, describe(e))))
        else:
            link.put(Reply(call_id, True, None))

    def stop_drivers(self) -> None:
        """Cancel the benchmark and stop the load generator (before the engine stops)."""
        self.bench_cancel.set()
        if self.bench is not None:
            self.bench.join(10.0)
        if self.load is not None:
            self.load.stop()
