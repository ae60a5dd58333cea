"""The benchmark as a background run every tab can see: modes alternated over repetitions.

Owns one BenchmarkRun per Streamlit server (``runs()``, shared by every session): a thread
that iterates EngineClient.run_benchmark over a spec whose modes are the chosen modes
alternated N times (sync, async, sync, async, ...), and records progress (requests finished,
tokens generated, which run) and the results as they come. The Benchmark page starts and
shows it; every page's banner says when one is running.

It must never call st.* from its thread, never start a second run while one is going, and
never leave the engine's settings changed (run_benchmark restores them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gapless.ui")

WARMUP_TOKENS = 4  # engine.drivers.workload.WARMUP_TOKENS: each run's unmeasured warm-up


def alternated(modes: list[dict[str, Any]], repetitions: int) -> list[dict[str, Any]]:
    """Each mode once per repetition, in turn: A, B, A, B, ... labelled "A #1", "B #1"...

    Alternating (rather than A, A, A, B, B, B) spreads slow drifts of the machine (other
    jobs, heat) over every mode alike.
    """
    from engine.drivers.workload import mode_label

    if isinstance(repetitions, bool) or not isinstance(repetitions, int) or repetitions < 1:
        raise ValueError(f"repetitions must be an integer >= 1, got {repetitions!r}")
    if not modes:
        raise ValueError("modes must be a non-empty list of live settings")
    return [
        {**m, "label": f"{mode_label(m)} #{r}"} for r in range(1, repetitions + 1) for m in modes
    ]


def base_label(label: str) -> str:
    """"async #2" -> "async"."""
    head, sep, tail = label.rpartition(" #")
    return head if sep and tail.isdigit() else label


@dataclass(slots=True)
class Progress:
    run_index: int = 0  # runs finished
    runs: int = 0
    label: str = ""  # the mode of the run going on now (the spec's order, not the last item)
    phase: str = ""  # "warming up" (no progress items come then) or "measuring"
    done: int = 0  # requests finished in the current run
    total: int = 0
    tokens: int = 0  # generated since the start (warm-ups included)
    tokens_expected: int = 0


@dataclass
class BenchmarkRun:
    """One benchmark in its own thread. Read ``progress``/``results`` under ``lock``."""

    client: Any
    spec: Any
    who: str = "a tab"  # who started it, for the log
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    results: list[Any] = field(default_factory=list)
    error: str | None = None
    cancelled: bool = False
    progress: Progress = field(default_factory=Progress)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _tokens0: int = 0

    def start(self) -> BenchmarkRun:
        runs = len(self.spec.modes)
        per_run = self.spec.num_requests * (
            self.spec.max_tokens + (min(WARMUP_TOKENS, self.spec.max_tokens)
                                    if self.spec.warmup else 0))
        self.progress = Progress(runs=runs, total=self.spec.num_requests,
                                 tokens_expected=runs * per_run)
        self._next_run(0)
        self._tokens0 = self._generated()
        from engine.drivers.workload import mode_label

        log.warning("benchmark started by %s: %d runs (%s); the engine's settings switch "
                    "with each run and are put back after", self.who, runs,
                    ", ".join(mode_label(m) for m in self.spec.modes))
        self._thread = threading.Thread(target=self._run, name="gapless-benchmark", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self.finished is None

    def cancel(self) -> None:
        self._cancel.set()

    def _generated(self) -> int:
        try:
            return int(self.client.stats().get("generated_tokens", 0))
        except Exception:  # progress is a nicety; the run itself reports real failures
            return 0

    def poll_tokens(self) -> None:
        """Refresh the tokens-generated progress (called by the page, not the thread)."""
        tokens = max(0, self._generated() - self._tokens0)
        with self.lock:
            self.progress.tokens = tokens

    def _next_run(self, index: int) -> None:
        """Label run ``index`` as soon as the previous one's result is in: the engine then
        switches to its mode and warms up, which yields no progress item (the label lagged
        the engine's mode line by the warm-up, ~5 s on a CPU). Caller holds the lock, or
        no thread runs yet."""
        from engine.drivers.workload import mode_label

        if index < len(self.spec.modes):
            self.progress.label = mode_label(self.spec.modes[index])
            self.progress.done = 0
            self.progress.phase = "warming up" if self.spec.warmup else "measuring"

    def _run(self) -> None:
        from engine.drivers.workload import BenchmarkResult

        items = None
        try:
            items = self.client.run_benchmark(self.spec)
            for item in items:
                with self.lock:
                    if isinstance(item, BenchmarkResult):
                        self.results.append(item)
                        self.progress.run_index = len(self.results)
                        self._next_run(len(self.results))
                    else:
                        self.progress.label = item.mode_label
                        self.progress.phase = "measuring"
                        self.progress.done, self.progress.total = item.done, item.total
                if self._cancel.is_set():
                    self.cancelled = True
                    break
        except Exception as exc:  # shown on the page; never a traceback
            log.exception("benchmark failed")
            with self.lock:
                self.error = str(exc) or type(exc).__name__
        finally:
            if items is not None and hasattr(items, "close"):
                try:
                    items.close()  # an early stop cancels the run in the engine
                except Exception:
                    log.exception("closing the benchmark iterator failed")
            with self.lock:
                self.finished = time.monotonic()
                outcome = ("failed: " + self.error if self.error else
                           "stopped" if self.cancelled else "done")
            log.warning("benchmark started by %s %s after %d of %d runs; the engine's "
                        "settings are put back", self.who, outcome, len(self.results),
                        len(self.spec.modes))


class Runs:
    """The server's current (or last) benchmark run, shared by every session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: BenchmarkRun | None = None

    def start(self, client: Any, spec: Any, who: str = "a tab") -> BenchmarkRun:
        with self._lock:
            if self.current is not None and self.current.running:
                raise ValueError("a benchmark is already running: wait for it or stop it")
            self.current = BenchmarkRun(client, spec, who).start()
            return self.current

    def running(self) -> BenchmarkRun | None:
        run = self.current
        return run if run is not None and run.running else None


RUNS = Runs()  # module state: one per Streamlit server process, like the engine client
