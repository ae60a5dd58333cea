"""The request ledger: device-time shares of a window add up to the window's device time."""

from __future__ import annotations

from telemetry.ledger import build_ledger, slowest_first, step_device_ns
from telemetry.records import RequestEvent, Span, StepRecord


def recorded_steps() -> list[StepRecord]:
    """Three steps as the loop records them: a prefill chunk, a mixed step, decodes."""
    steps = [
        StepRecord(0, "async", 0, 1, 16, 0, spans=[Span("compute", 100, 400)],
                   chunks=[("a", 16, 16)]),
        StepRecord(1, "async", 1, 2, 7, 1, spans=[Span("compute", 400, 1100)],
                   chunks=[("a", 1, 17), ("b", 7, 7)]),
        StepRecord(2, "async", 0, 2, 0, 2, spans=[Span("compute", 1100, 1350)],
                   chunks=[("a", 1, 18), ("b", 1, 8)]),
    ]
    return steps


def test_device_time_shares_of_a_window_sum_to_its_device_time():
    steps = recorded_steps()
    events = [RequestEvent("a", "queued", 0, prompt_tokens=16),
              RequestEvent("b", "queued", 50, prompt_tokens=7),
              RequestEvent("a", "finished", 1400, reason="length"),
              RequestEvent("b", "finished", 1500, reason="stop")]
    for window in (steps, steps[1:], steps[:1]):
        ledger = build_ledger(window, events, kv_bytes_per_token=10)
        assert abs(sum(e.device_ns for e in ledger.values())
                   - sum(step_device_ns(r) for r in window)) < 1e-6
    ledger = build_ledger(steps, events, kv_bytes_per_token=10)
    a, b = ledger["a"], ledger["b"]
    assert a.prefill_steps == [0] and a.decode_steps == [1, 2]
    assert b.prefill_steps == [1] and b.decode_steps == [2]
    assert a.kv_bytes_read == (16 + 17 + 18) * 10
    assert abs(b.device_ns - (700 * 7 / 8 + 250 / 2)) < 1e-6
    assert [e.request_id for e in slowest_first(ledger.values())] == ["b", "a"]
