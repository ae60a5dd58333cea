"""The engine process: an Engine, an NVML sampler and a load generator behind one pipe.

Owns the child side of the process boundary (DESIGN.md section 5) and the wire protocol.
engine/client.py starts this module as a fresh interpreter (``python -c "from engine.process.server
import main; main()" --fd N --parent PID``), hands it one end of a socket pair and sends the
EngineConfig as a dict. The child builds the Engine, answers "ready" (or "failed" with a
message a user can act on, e.g. a missing model) and then serves commands until told to
shut down or until its parent is gone.

Wire protocol (pickled over multiprocessing.connection.Connection):

- client -> engine: ``(call_id, command, pickled kwargs)``; commands are the keys of
  EngineServer.commands plus shutdown, run_benchmark and cancel_benchmark. Every command
  gets exactly one ``("reply", call_id, ok, value)``; when ok is False, value is
  ``(exception type name, message)`` and the client raises ValueError for "ValueError"
  (bad input, same message) and EngineError otherwise.
- engine -> client: lists of messages (one send carries everything queued, so a busy
  engine costs one syscall per batch, not per token):
  ``("delta", rid, text)``, ``("end", rid, RequestOutput as a dict)``,
  ``("telemetry", steps, events)`` every ~50 ms when anything is new (records encoded as
  tuples, see encode_steps),
  ``("nvml", NvmlReading dict | None, reason | None)`` when a new reading exists,
  ``("bench", call_id, BenchmarkProgress | BenchmarkResult)`` during run_benchmark,
  ``("ready", info)`` / ``("failed", message)`` once at start.

The child never imports streamlit or anything under ui/ (multiprocessing's spawn would
re-run the parent's __main__ here, which under `streamlit run` is streamlit's launcher:
that is why the client starts a plain interpreter instead). It ignores SIGINT (Ctrl-C in a
terminal reaches the whole process group; the parent decides when the engine stops) and
exits when its parent dies: the pipe reaches EOF and a watchdog thread sees getppid()
change. PR_SET_PDEATHSIG is deliberately not used: it fires when the *thread* that started
the child exits, and a Streamlit script thread that created the client ends at every rerun.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import operator
import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from telemetry.records import RequestEvent, Span, StepRecord

log = logging.getLogger("gapless.server")

TELEMETRY_PERIOD_S = 0.05
WATCHDOG_PERIOD_S = 0.5
# Telemetry is skipped (the bus reader then drops oldest, and counts it) while this many
# messages wait to be sent: a stalled client must not make the engine process grow.
MAX_BACKLOG = 2000
MAX_BATCH = 512

Message = tuple[Any, ...]

# Telemetry travels as plain tuples: pickling a frozen slots dataclass costs ~30x more, and
# that cost is paid in the engine process, on the GIL the step loop needs. The client
# rebuilds the records (decode_steps / decode_events), in its own process.
STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepRecord) if f.name != "spans")
EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(RequestEvent))
_step_values = operator.attrgetter(*STEP_FIELDS)
_event_values = operator.attrgetter(*EVENT_FIELDS)


def encode_steps(records: list[StepRecord]) -> list[tuple[Any, ...]]:
    return [(_step_values(r), [(s.lane, s.start_ns, s.end_ns) for s in r.spans])
            for r in records]


def decode_steps(rows: list[tuple[Any, ...]]) -> list[StepRecord]:
    return [StepRecord(**dict(zip(STEP_FIELDS, values, strict=True)),
                       spans=[Span(*s) for s in spans]) for values, spans in rows]


def encode_events(events: list[RequestEvent]) -> list[tuple[Any, ...]]:
    return [_event_values(e) for e in events]


def decode_events(rows: list[tuple[Any, ...]]) -> list[RequestEvent]:
    return [RequestEvent(*row) for row in rows]


def describe(exc: BaseException) -> str:
    """A user-facing message: ValueErrors already say what is wrong and what is allowed."""
    if isinstance(exc, ValueError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class EngineServer:
    """Serves one client over ``conn``. Commands run on the calling thread (serve()), in
    order, except run_benchmark, which runs on its own thread so that stats, settings and
    the dashboard's other calls are answered while it runs."""

    def __init__(self, conn: Connection, engine: Any, nvml: Any) -> None:
        self.conn = conn
        self.engine = engine
        self.nvml = nvml
        self.outbox: queue.Queue[Message | None] = queue.Queue()
        self.load: Any = None  # engine.drivers.loadgen.LoadGenerator while one exists
        self.bench: threading.Thread | None = None
        self.bench_cancel = threading.Event()
        self.stopping = threading.Event()
        self.commands: dict[str, Callable[..., Any]] = {
            "submit": self.submit,
            "abort": self.abort,
            "configure": self.configure,
            "settings": engine.settings,
            "stats": engine.stats,
            "start_load": self.start_load,
            "stop_load": self.stop_load,
            "load_running": self.load_running,
            "load_stats": self.load_stats,
            "process_info": self.process_info,
            "record_anatomy": self.record_anatomy,
        }
        self._sender = threading.Thread(target=self._send_loop, name="gapless-send", daemon=True)
        self._pump = threading.Thread(target=self._pump_loop, name="gapless-pump", daemon=True)

    # ------------------------------------------------------------------------ serving
    def serve(self) -> int:
        self._sender.start()
        self._pump.start()
        while True:
            try:
                call_id, command, payload = self.conn.recv()
            except (EOFError, OSError):
                log.warning("the client's pipe closed without a shutdown: exiting")
                os._exit(3)
            try:
                kwargs = pickle.loads(payload)
            except Exception as e:  # e.g. a class this process cannot import
                self.reply(call_id, False, ("ValueError", f"the engine process cannot read "
                                            f"the arguments of {command}: {describe(e)}"))
                continue
            if command == "shutdown":
                self.shutdown()
                self.reply(call_id, True, None)
                self._flush_and_close()
                return 0
            if command == "run_benchmark":
                self.start_benchmark(call_id, **kwargs)
                continue
            if command == "cancel_benchmark":
                self.bench_cancel.set()
                self.reply(call_id, True, None)
                continue
            fn = self.commands.get(command)
            try:
                if fn is None:
                    raise ValueError(f"unknown engine command {command!r}")
                value = fn(**kwargs)
            except Exception as e:
                if not isinstance(e, ValueError):
                    log.exception("engine command %s failed", command)
                self.reply(call_id, False, (type(e).__name__, describe(e)))
            else:
                self.reply(call_id, True, value)

    def reply(self, call_id: int, ok: bool, value: Any) -> None:
        self.outbox.put(("reply", call_id, ok, value))

    def _send_loop(self) -> None:
        while True:
            first = self.outbox.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    msg = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if msg is None:
                    self.outbox.put(None)  # see it again after this batch
                    break
                batch.append(msg)
            try:
                self.conn.send_bytes(self._pickle_batch(batch))
            except OSError:  # the parent is gone; the watchdog ends us
                return

    @staticmethod
    def _pickle_batch(batch: list[Message]) -> bytes:
        try:
            return bytes(ForkingPickler.dumps(batch))
        except Exception:  # one bad value must not silence the pipe: find it, answer instead
            good: list[Message] = []
            for msg in batch:
                try:
                    ForkingPickler.dumps(msg)
                except Exception as e:
                    log.exception("cannot send a %r message", msg[0])
                    if msg[0] == "reply":
                        msg = ("reply", msg[1], False, ("EngineError",
                               f"the engine's answer could not be sent: {describe(e)}"))
                    else:
                        continue
                good.append(msg)
            return bytes(ForkingPickler.dumps(good))

    def _pump_loop(self) -> None:
        reader = self.engine.bus.reader()
        last_nvml: Any = None
        while not self.stopping.is_set():
            time.sleep(TELEMETRY_PERIOD_S)
            if self.outbox.qsize() > MAX_BACKLOG:
                continue
            steps, events = reader.steps(), reader.events()
            if steps or events:
                self.outbox.put(("telemetry", encode_steps(steps), encode_events(events)))
            reading = self.nvml.latest()
            if reading is not None and reading is not last_nvml:
                last_nvml = reading
                self.outbox.put(("nvml", dataclasses.asdict(reading), None))

    def _flush_and_close(self) -> None:
        self.outbox.put(None)
        self._sender.join(10.0)
        self.conn.close()

    # ----------------------------------------------------------------------- commands
    def _refuse_during_benchmark(self, what: str) -> None:
        if self.bench is not None and self.bench.is_alive():
            raise ValueError(f"a benchmark is running; {what} once it has finished")

    def submit(self, prompt: Any, params: Any = None, request_id: str | None = None) -> str:
        self._refuse_during_benchmark("submit requests")
        # Callbacks run on the engine's loop thread and only queue a message: no thread per
        # request competing for the GIL with the engine.
        outbox = self.outbox
        handle = self.engine.submit(
            prompt, params, request_id=request_id,
            on_delta=lambda rid, delta: outbox.put(("delta", rid, delta)),
            on_finish=lambda out: outbox.put(("end", out.request_id, dataclasses.asdict(out))),
        )
        return str(handle.request_id)

    def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    def configure(self, **kwargs: Any) -> dict[str, Any]:
        self._refuse_during_benchmark("change settings")
        return dict(self.engine.configure(**kwargs))

    def start_load(self, spec: Any) -> dict[str, Any]:
        from engine.drivers.loadgen import LoadGenerator, LoadSpec

        self._refuse_during_benchmark("start the load generator")
        if not isinstance(spec, LoadSpec):
            raise ValueError(f"start_load needs an engine.drivers.loadgen.LoadSpec, got {spec!r}")
        gen = LoadGenerator(self.engine, spec)  # validates before the old one is stopped
        if self.load is not None:
            self.load.stop()
        self.load = gen.start()
        return self.load_stats()

    def stop_load(self) -> dict[str, Any]:
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

    def process_info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "parent_pid": os.getppid(),
            "python": sys.executable,
            "streamlit_imported": "streamlit" in sys.modules,
            "ui_imported": any(m == "ui" or m.startswith("ui.") for m in sys.modules),
            "nvml_available": self.nvml.available,
            "nvml_reason": self.nvml.reason,
        }

    def record_anatomy(self, n_steps: int = 8, timeout_s: float = 30.0) -> dict[str, Any]:
        """Kernels of the next n_steps steps (engine.step.anatomy); blocks this thread."""
        from engine.step.anatomy import anatomy_summary, record_anatomy

        return anatomy_summary(record_anatomy(self.engine, n_steps, timeout_s))

    def start_benchmark(self, call_id: int, spec: Any) -> None:
        try:
            self._refuse_during_benchmark("start another")
            if self.load_running():
                raise ValueError("the load generator is running; stop it before a benchmark")
        except ValueError as e:
            self.reply(call_id, False, ("ValueError", str(e)))
            return
        self.bench_cancel = threading.Event()
        self.bench = threading.Thread(target=self._benchmark, args=(call_id, spec),
                                      name="gapless-bench", daemon=True)
        self.bench.start()

    def _benchmark(self, call_id: int, spec: Any) -> None:
        from engine.drivers.workload import BenchmarkSpec, run_benchmark

        try:
            if not isinstance(spec, BenchmarkSpec):
                raise ValueError(f"run_benchmark needs an engine.drivers.workload.BenchmarkSpec, "
                                 f"got {spec!r}")
            for item in run_benchmark(self.engine, spec, cancel=self.bench_cancel):
                self.outbox.put(("bench", call_id, item))
        except Exception as e:
            if not isinstance(e, ValueError):
                log.exception("benchmark failed")
            self.reply(call_id, False, (type(e).__name__, describe(e)))
        else:
            self.reply(call_id, True, None)

    def shutdown(self) -> None:
        self.bench_cancel.set()
        if self.bench is not None:
            self.bench.join(10.0)
        if self.load is not None:
            self.load.stop()
        self.engine.shutdown()
        self.stopping.set()
        self.nvml.close()


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent is gone (we were re-parented): nothing here outlives it.
    The kernel frees the device memory of a process that exits."""
    while True:
        if os.getppid() != parent_pid:
            log.warning("parent process %d is gone: exiting", parent_pid)
            os._exit(4)
        time.sleep(WATCHDOG_PERIOD_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="gapless engine process (started by "
                                     "engine.process.client.EngineClient)")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the client")
    parser.add_argument("--parent", type=int, required=True, help="pid of the client process")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code (CUDA, triton) says where, on stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="engine[%(process)d] %(levelname)s %(name)s: %(message)s")
    os.set_inheritable(args.fd, False)  # nothing we start may hold the client's pipe open
    conn = Connection(args.fd)
    threading.Thread(target=_watch_parent, args=(args.parent,), name="gapless-watchdog",
                     daemon=True).start()
    try:
        _, _, payload = conn.recv()
        config_dict = pickle.loads(payload)["config"]
    except (EOFError, OSError):
        os._exit(3)
    try:
        from engine.config import EngineConfig
        from engine.engine import Engine
        from telemetry.nvml import NvmlSampler

        config = EngineConfig.from_dict(config_dict)
        engine = Engine(config)
        nvml = NvmlSampler(interval_s=config.nvml_interval_s)
        nvml.start()
    except BaseException as e:
        traceback.print_exc()
        try:
            conn.send([("failed", describe(e))])
        finally:
            conn.close()
        sys.exit(1)
    server = EngineServer(conn, engine, nvml)
    server.outbox.put(("ready", {
        "pid": os.getpid(),
        "settings": engine.settings(),
        "nvml_available": nvml.available,
        "nvml_reason": None if nvml.available else nvml.reason,
    }))
    code = server.serve()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: torch's can take seconds, nothing is left


if __name__ == "__main__":
    main()
