"""TelemetryBus: independent readers, drops, snapshots, the disabled switch."""

from __future__ import annotations

import threading

import pytest

from telemetry.bus import BusStats, TelemetryBus
from telemetry.records import RequestEvent, Span, StepRecord


def step(i: int) -> StepRecord:
    return StepRecord(
        step=i,
        mode="async",
        slot=i % 2,
        num_requests=1,
        prefill_tokens=0,
        decode_tokens=1,
        spans=[Span("compute", i * 10, i * 10 + 5)],
    )


def event(i: int) -> RequestEvent:
    return RequestEvent(request_id=f"r{i}", kind="queued", t_ns=i)


def test_reader_sees_only_what_is_new() -> None:
    bus = TelemetryBus()
    r = bus.reader()
    bus.publish_step(step(0))
    bus.publish_step(step(1))
    bus.publish_event(event(0))
    assert [s.step for s in r.steps()] == [0, 1]
    assert [e.request_id for e in r.events()] == ["r0"]
    assert r.steps() == []
    assert r.events() == []
    bus.publish_step(step(2))
    assert [s.step for s in r.steps()] == [2]
    assert r.dropped == 0


def test_readers_have_independent_cursors() -> None:
    bus = TelemetryBus()
    a, b = bus.reader(), bus.reader()
    for i in range(3):
        bus.publish_step(step(i))
    assert [s.step for s in a.steps()] == [0, 1, 2]
    bus.publish_step(step(3))
    assert [s.step for s in a.steps()] == [3]
    assert [s.step for s in b.steps()] == [0, 1, 2, 3]


def test_late_reader_gets_held_history_or_nothing_from_now() -> None:
    bus = TelemetryBus(step_capacity=4)
    for i in range(6):
        bus.publish_step(step(i))
    late = bus.reader()
    now = bus.reader(from_now=True)
    assert [s.step for s in late.steps()] == [2, 3, 4, 5]
    assert late.dropped == 0  # drops before a reader existed are not its losses
    assert now.steps() == []
    bus.publish_step(step(6))
    assert [s.step for s in now.steps()] == [6]


def test_slow_reader_counts_exactly_what_it_missed() -> None:
    bus = TelemetryBus(step_capacity=4, event_capacity=2)
    r = bus.reader()
    for i in range(10):
        bus.publish_step(step(i))
    for i in range(5):
        bus.publish_event(event(i))
    assert [s.step for s in r.steps()] == [6, 7, 8, 9]
    assert [e.request_id for e in r.events()] == ["r3", "r4"]
    assert (r.dropped_steps, r.dropped_events, r.dropped) == (6, 3, 9)
    assert bus.stats() == BusStats(True, 10, 6, 5, 3)


def test_max_items_pages_through() -> None:
    bus = TelemetryBus()
    r = bus.reader()
    for i in range(5):
        bus.publish_step(step(i))
    assert [s.step for s in r.steps(max_items=3)] == [0, 1, 2]
    assert [s.step for s in r.steps(max_items=3)] == [3, 4]


def test_snapshots_do_not_move_cursors() -> None:
    bus = TelemetryBus(step_capacity=8)
    r = bus.reader()
    for i in range(10):
        bus.publish_step(step(i))
        bus.publish_event(event(i))
    assert [s.step for s in bus.snapshot_steps(3)] == [7, 8, 9]
    assert [e.t_ns for e in bus.snapshot_events(2)] == [8, 9]
    assert [s.step for s in bus.snapshot_steps(100)] == list(range(2, 10))
    assert len(r.steps()) == 8  # still everything held


def test_disabled_bus_publishes_nothing() -> None:
    bus = TelemetryBus(enabled=False)
    r = bus.reader()
    bus.publish_step(step(0))
    bus.publish_event(event(0))
    assert r.steps() == [] and r.events() == []
    assert bus.stats() == BusStats(False, 0, 0, 0, 0)
    bus.enabled = True
    bus.publish_step(step(1))
    assert [s.step for s in r.steps()] == [1]


@pytest.mark.parametrize(
    "kwargs", [{"step_capacity": 0}, {"event_capacity": -1}, {"step_capacity": 1.5}]
)
def test_bad_capacity_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        TelemetryBus(**kwargs)


def test_engine_thread_publishes_while_ui_thread_reads() -> None:
    total = 50_000
    bus = TelemetryBus(step_capacity=256, event_capacity=512)
    done = threading.Event()
    errors: list[BaseException] = []
    seen: dict[str, int] = {}
    r = bus.reader()  # before the engine starts, so every drop is this reader's loss

    def engine() -> None:
        for i in range(total):
            bus.publish_step(step(i))
            bus.publish_event(event(i))
        done.set()

    def ui() -> None:
        try:
            steps = events = 0
            last_step = -1
            while True:
                finished = done.is_set()
                for s in r.steps():
                    assert s.step > last_step  # order is preserved across drops
                    last_step = s.step
                    steps += 1
                events += len(r.events())
                if finished and r.steps() == [] and r.events() == []:
                    break
            seen.update(
                steps=steps,
                events=events,
                dropped_steps=r.dropped_steps,
                dropped_events=r.dropped_events,
                last_step=last_step,
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ui), threading.Thread(target=engine)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert seen["steps"] + seen["dropped_steps"] == total
    assert seen["events"] + seen["dropped_events"] == total
    assert seen["last_step"] == total - 1
    stats = bus.stats()
    assert (stats.steps_published, stats.events_published) == (total, total)
