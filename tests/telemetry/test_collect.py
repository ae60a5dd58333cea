"""StepCollector keeps every step of a run longer than the bus ring; reading the ring once
at the end (the negative control) keeps only its last ring's worth."""

from __future__ import annotations

import time

import pytest

from telemetry.bus import TelemetryBus
from telemetry.collect import StepCollector
from telemetry.records import Span, StepRecord


def rec(n: int) -> StepRecord:
    return StepRecord(step=n, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, spans=[Span("compute", n * 10, n * 10 + 9)])


def test_a_run_longer_than_the_ring_keeps_every_step() -> None:
    bus = TelemetryBus(step_capacity=256)
    bus.publish_step(rec(-1))  # before the run: not part of it
    once = bus.reader(from_now=True)
    with StepCollector(bus, period_s=0.001) as c:
        for n in range(1000):
            bus.publish_step(rec(n))
            if n % 32 == 31:
                time.sleep(0.01)  # the engine's pace: far slower than the drain
    assert [r.step for r in c.records] == list(range(1000))
    assert c.dropped_steps == 0
    late = once.steps()
    assert len(late) == 256 and once.dropped_steps == 1000 - 256  # one late read loses steps


def test_missed_steps_are_counted_and_bad_period_refused() -> None:
    bus = TelemetryBus(step_capacity=8)
    c = StepCollector(bus, period_s=10.0)  # never drains on its own in this test
    for n in range(20):
        bus.publish_step(rec(n))
    c.stop()
    assert len(c.records) == 8 and c.dropped_steps == 12
    with pytest.raises(ValueError, match="period_s"):
        StepCollector(bus, period_s=0)
