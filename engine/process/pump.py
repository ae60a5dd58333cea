"""The engine process's pump: telemetry, NVML readings and the heartbeat, for every client.

Owns one thread beside the step loop, never on it: every TELEMETRY_PERIOD_S it drains the
engine's telemetry bus, looks for a new NVML reading and, every HEARTBEAT_PERIOD_S, says how
far the step loop has come (``LoopWatch``: how long it has made no progress although requests
were unfinished). Each message is pickled once and the same bytes go to every client.

It never runs a command, never waits on a client (it only puts frames into the links' queues;
a link whose backlog is over MAX_BACKLOG misses telemetry, never the heartbeat), and never
stops on a failure: the pump's silence would read, on every client, as a hung engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.process.links import MAX_BACKLOG, ClientLink
from engine.process.wire import (
    HEARTBEAT_PERIOD_S,
    Heartbeat,
    Nvml,
    Telemetry,
    encode,
    encode_events,
    encode_steps,
    pickle_frame,
)

log = logging.getLogger("gapless.server")

TELEMETRY_PERIOD_S = 0.05


class LoopWatch:
    """How long the step loop has made no progress although requests were unfinished."""

    def __init__(self) -> None:
        self.step = -1
        self.progress_ns = 0

    def observe(self, step: int, unfinished: int, now_ns: int) -> float:
        if step != self.step or unfinished == 0:
            self.step, self.progress_ns = step, now_ns
            return 0.0
        return (now_ns - self.progress_ns) / 1e9


class Pump:
    """``links`` returns the clients connected now; the pump runs until ``stopping`` is set."""

    def __init__(self, engine: Any, nvml: Any, links: Callable[[], list[ClientLink]],
                 stopping: threading.Event) -> None:
        self.engine = engine
        self.nvml = nvml
        self.links = links
        self.stopping = stopping
        self.watch = LoopWatch()
        self.last_reading: Any = None
        self.next_beat = 0.0
        self._thread = threading.Thread(target=self._run, name="gapless-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        reader = self.engine.bus.reader()
        while not self.stopping.is_set():
            time.sleep(TELEMETRY_PERIOD_S)
            try:
                self.once(reader)
            except Exception:
                log.exception("the telemetry pump failed; going on")
                time.sleep(HEARTBEAT_PERIOD_S)

    def once(self, reader: Any) -> None:
        """One round: what the bus gathered, a new NVML reading, the heartbeat when due."""
        links = self.links()
        steps, events = reader.steps(), reader.events()
        if steps or events:
            frame = pickle_frame(encode(Telemetry(encode_steps(steps), encode_events(events))))
            for link in links:
                if link.backlog() <= MAX_BACKLOG:
                    link.put_frame(frame)
        reading = self.nvml.latest()
        if reading is not None and reading is not self.last_reading:
            self.last_reading = reading
            frame = pickle_frame(encode(Nvml(dataclasses.asdict(reading))))
            for link in links:
                link.put_frame(frame)
        if time.monotonic() >= self.next_beat:
            self.next_beat = time.monotonic() + HEARTBEAT_PERIOD_S
            step, unfinished = self.engine.loop.step_no, self.engine.stats()["unfinished"]
            beat = Heartbeat(step, unfinished,
                             self.watch.observe(step, unfinished, time.perf_counter_ns()))
            frame = pickle_frame(encode(beat))
            for link in links:
                link.put_frame(frame)
