"""The request ledger: device-time shares of a window add up to the window's device time."""

from __future__ import annotations

from telemetry.ledger import (
    build_ledger,
    request_ledger,
    slowest_first,
    step_device_ns,
    steps_of,
    window_device_ns,
)
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
              RequestEvent("b", "finished", 1500, reason="stop", cached_tokens=4,
                           preemptions=1)]
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
    assert (b.cached_tokens, b.preemptions, b.finish_reason) == (4, 1, "stop")
    assert (a.cached_tokens, a.preemptions) == (0, 0)


def test_a_window_that_drops_a_requests_steps_still_sums_to_its_device_time():
    """Steps that carry other requests, or none (telemetry without chunks), must neither
    lose device time from the shares nor invent it."""
    steps = recorded_steps()
    steps.append(StepRecord(3, "async", 1, 0, 0, 0, spans=[Span("compute", 1350, 1400)]))
    ledger = build_ledger(steps[1:3], [])
    assert abs(sum(e.device_ns for e in ledger.values()) - window_device_ns(steps[1:3])) < 1e-6
    # A step with no chunks adds device time nobody rode: the ledger says nothing of it.
    with_empty = build_ledger(steps, [])
    assert sum(e.device_ns for e in with_empty.values()) == window_device_ns(steps[:3])
    assert with_empty["a"].partial  # no queue event in the window


def test_unfinished_and_aborted_requests():
    steps = recorded_steps()
    events = [RequestEvent("a", "queued", 0, prompt_tokens=16),
              RequestEvent("b", "queued", 50, prompt_tokens=7),
              RequestEvent("b", "scheduled", 400, prompt_tokens=7),
              RequestEvent("b", "first_token", 1100, 1, prompt_tokens=7),
              RequestEvent("b", "tokens", 1350, 1, prompt_tokens=7),
              RequestEvent("a", "finished", 1360, reason="abort")]
    ledger = build_ledger(steps, events)
    assert ledger["a"].aborted and ledger["a"].finished
    assert not ledger["b"].finished and ledger["b"].e2e_s is None
    assert ledger["b"].output_tokens == 2 and ledger["b"].queue_s == 350 / 1e9
    assert ledger["b"].ttft_s == 1050 / 1e9
    assert [e.request_id for e in slowest_first(ledger.values())] == ["a"]


def test_one_requests_ledger_and_its_steps_on_the_timeline():
    steps = recorded_steps()
    steps.append(StepRecord(3, "async", 1, 1, 0, 1, spans=[Span("compute", 1350, 1500)],
                            chunks=[("a", 1, 19)]))
    events = [RequestEvent("b", "queued", 50, prompt_tokens=7),
              RequestEvent("b", "finished", 1400, reason="stop")]
    b = request_ledger(steps, events, "b", kv_bytes_per_token=2)
    assert b is not None and b.steps == [1, 2] and b.kv_bytes_read == (7 + 8) * 2
    # Its own steps' shares, not the whole window's (a's solo steps are not b's).
    assert abs(b.device_ns - (700 * 7 / 8 + 250 / 2)) < 1e-6
    assert (b.first_step_ns, b.last_step_ns) == (400, 1350)
    assert [r.step for r in steps_of(b, steps)] == [0, 1, 2, 3]  # 0 and 3 touch its ends
    assert request_ledger(steps, events, "nobody") is None


def test_only_the_asked_requests_with_the_same_shares():
    steps = recorded_steps()
    events = [RequestEvent("a", "queued", 0, prompt_tokens=16),
              RequestEvent("b", "queued", 50, prompt_tokens=7)]
    whole = build_ledger(steps, events, kv_bytes_per_token=3)
    some = build_ledger(steps, events, kv_bytes_per_token=3, only={"b"})
    assert list(some) == ["b"]
    assert some["b"].to_dict() == whole["b"].to_dict()
