"""Collect every step of a run, however long: a bus reader drained on a daemon thread.

Owns keeping a whole run's step records and request events for benchmarks. The bus is a
bounded ring (4,096 steps by default) so that the engine never blocks on a slow reader; a
benchmark that read the bus once at the end would see only its last 4,096 steps. This
collector drains its own reader every ``period_s`` (50 ms: a ring's worth of steps would
need > 80,000 steps/s to overflow it) and counts what it still missed (``dropped_steps``),
so a figure computed from ``records`` can say whether it covers the whole run.

It must never block or slow the engine (it only reads the ring), and never import anything
of ours beyond telemetry.
"""

from __future__ import annotations

import threading

from telemetry.bus import BusReader, TelemetryBus
from telemetry.records import RequestEvent, StepRecord


class StepCollector:
    """``with StepCollector(bus) as c: run()`` then ``c.records``, ``c.events``."""

    def __init__(self, bus: TelemetryBus, period_s: float = 0.05) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        self.period_s = float(period_s)
        self._reader: BusReader = bus.reader(from_now=True)
        self.records: list[StepRecord] = []
        self.events: list[RequestEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def dropped_steps(self) -> int:
        """Step records overwritten in the ring before this collector read them."""
        return self._reader.dropped_steps

    def drain(self) -> None:
        """Take what is new now (the thread calls this; so may the owner)."""
        self.records += self._reader.steps()
        self.events += self._reader.events()

    def start(self) -> StepCollector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="step-collector",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> StepCollector:
        """Stop the thread and take the last records published so far."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.drain()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.drain()

    def __enter__(self) -> StepCollector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
