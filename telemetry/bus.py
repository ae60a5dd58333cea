"""The telemetry bus: where the engine publishes step records and request events.

Owns two bounded rings (one for StepRecord, one for RequestEvent) and the readers that
consume them. Publishing never blocks and never fails: when a reader is slow the oldest
records are overwritten, and the reader is told how many it missed.

It must never block or raise in publish_step / publish_event (they run on the engine's hot
loop), never copy or inspect records on publish, and never know who reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.records import RequestEvent, StepRecord
from telemetry.ring import Ring


@dataclass(slots=True, frozen=True)
class BusStats:
    """Counts since the bus was made. ``*_dropped`` are overwritten records (ring-wide)."""

    enabled: bool
    steps_published: int
    steps_dropped: int
    events_published: int
    events_dropped: int


class BusReader:
    """One consumer's view of the bus: each call returns what is new since the last call.

    A new reader starts at the oldest record still held, so a dashboard opened late still
    sees recent history. One reader belongs to one consumer; do not share it across threads.
    """

    __slots__ = ("_bus", "_step_cursor", "_event_cursor", "dropped_steps", "dropped_events")

    def __init__(self, bus: TelemetryBus, from_now: bool = False) -> None:
        self._bus = bus
        steps, events = bus._steps, bus._events
        self._step_cursor = steps.head if from_now else steps.oldest
        self._event_cursor = events.head if from_now else events.oldest
        self.dropped_steps = 0
        self.dropped_events = 0

    @property
    def dropped(self) -> int:
        """Records (steps + events) this reader missed because it read too slowly."""
        return self.dropped_steps + self.dropped_events

    def steps(self, max_items: int | None = None) -> list[StepRecord]:
        items, self._step_cursor, missed = self._bus._steps.read_since(self._step_cursor, max_items)
        self.dropped_steps += missed
        return items

    def events(self, max_items: int | None = None) -> list[RequestEvent]:
        items, self._event_cursor, missed = self._bus._events.read_since(
            self._event_cursor, max_items
        )
        self.dropped_events += missed
        return items


class TelemetryBus:
    """Bounded, non-blocking channel from the engine thread to any number of readers."""

    def __init__(
        self, step_capacity: int = 4096, event_capacity: int = 65536, enabled: bool = True
    ) -> None:
        for name, cap in (("step_capacity", step_capacity), ("event_capacity", event_capacity)):
            if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
                raise ValueError(f"{name} must be a positive int, got {cap!r}")
        self._steps: Ring[StepRecord] = Ring(step_capacity)
        self._events: Ring[RequestEvent] = Ring(event_capacity)
        # Plain attribute: a disabled bus drops what is published. (The engine, with telemetry
        # off, does not publish at all: its step loop gets no bus and records no timings.)
        self.enabled = bool(enabled)

    def publish_step(self, rec: StepRecord) -> None:
        """Hand a finished step to readers. The bus keeps the object: do not mutate it after."""
        if self.enabled:
            self._steps.append(rec)

    def publish_event(self, ev: RequestEvent) -> None:
        if self.enabled:
            self._events.append(ev)

    def reader(self, from_now: bool = False) -> BusReader:
        """A new independent reader (its own cursors). ``from_now`` skips held history."""
        return BusReader(self, from_now=from_now)

    def snapshot_steps(self, last_n: int) -> list[StepRecord]:
        """The newest ``last_n`` step records, oldest first; moves no reader's cursor."""
        return self._steps.last(last_n)

    def snapshot_events(self, last_n: int) -> list[RequestEvent]:
        return self._events.last(last_n)

    def stats(self) -> BusStats:
        return BusStats(
            enabled=self.enabled,
            steps_published=self._steps.head,
            steps_dropped=self._steps.dropped,
            events_published=self._events.head,
            events_dropped=self._events.dropped,
        )
