"""Request latency maths on hand-made events."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from telemetry.metrics import Distribution, distribution, request_latencies, summarize_latencies
from telemetry.records import RequestEvent as Ev


def same(d: Distribution, count: int, mean: float, p50: float, p90: float, p99: float) -> bool:
    """Exact count; statistics to 1e-12 (percentile interpolation is float arithmetic)."""
    return dataclasses.astuple(d) == pytest.approx((count, mean, p50, p90, p99), rel=1e-12)


# Request a: a "first_token" marker (num_tokens 0) and every token on "tokens" events.
# Tokens at 5000 (1), 7000 (1), 11000 (1), 17000 (2): ITL samples 2000, 4000, 3000, 3000.
A = [
    Ev("a", "queued", 0, prompt_tokens=12),
    Ev("a", "scheduled", 1000),
    Ev("a", "first_token", 5000),
    Ev("a", "tokens", 5000, num_tokens=1),
    Ev("a", "tokens", 7000, num_tokens=1),
    Ev("a", "tokens", 11000, num_tokens=1),
    Ev("a", "tokens", 17000, num_tokens=2),
    Ev("a", "finished", 17500, reason="length"),
]
# Request b: the first token counted on the first_token event; still running.
B = [
    Ev("b", "queued", 500, prompt_tokens=3),
    Ev("b", "scheduled", 900),
    Ev("b", "first_token", 2000, num_tokens=1),
    Ev("b", "tokens", 2600, num_tokens=1),
]


def test_per_request_figures() -> None:
    events = A + B
    random.Random(7).shuffle(events)  # order of arrival must not matter
    lat = request_latencies(events)
    a, b = lat["a"], lat["b"]
    assert (a.prompt_tokens, a.output_tokens) == (12, 5)
    assert (a.queue_ns, a.ttft_ns, a.e2e_ns) == (1000, 5000, 17500)
    assert a.itl_ns == (2000.0, 4000.0, 3000.0, 3000.0)
    assert same(a.itl, 4, 3000.0, 3000.0, 3700.0, 3970.0)
    assert a.finished and a.finish_reason == "length"
    assert (b.prompt_tokens, b.output_tokens) == (3, 2)
    assert (b.queue_ns, b.ttft_ns, b.e2e_ns) == (400, 1500, None)
    assert b.itl_ns == (600.0,)
    assert not b.finished and b.finish_reason is None


def test_mean_itl_equals_decode_time_over_tokens_after_first() -> None:
    a = request_latencies(A)["a"]
    # (t_last - t_first) / (output_tokens - 1) = (17000 - 5000) / 4
    assert a.itl.mean == (17000 - 5000) / (a.output_tokens - 1)


def test_missing_events_give_none_not_guesses() -> None:
    lat = request_latencies(
        [Ev("c", "tokens", 300, num_tokens=1), Ev("c", "finished", 400, reason="stop")]
    )["c"]
    assert (lat.queue_ns, lat.ttft_ns, lat.e2e_ns) == (None, None, None)
    assert lat.output_tokens == 1 and lat.itl_ns == ()
    queued_only = request_latencies([Ev("d", "queued", 0)])["d"]
    assert queued_only.ttft_ns is None and queued_only.output_tokens == 0


def test_first_token_time_without_a_marker_is_the_first_token_event() -> None:
    lat = request_latencies(
        [
            Ev("e", "queued", 100),
            Ev("e", "tokens", 350, num_tokens=1),
            Ev("e", "tokens", 450, num_tokens=1),
        ]
    )["e"]
    assert lat.ttft_ns == 250 and lat.itl_ns == (100.0,)


def test_aggregate_over_requests() -> None:
    s = summarize_latencies(request_latencies(A + B))
    assert (s.requests, s.finished, s.output_tokens) == (2, 1, 7)
    assert same(s.ttft, 2, 3250.0, 3250.0, 4650.0, 4965.0)
    assert same(s.queue, 2, 700.0, 700.0, 940.0, 994.0)
    # ITL pools tokens: 2000, 4000, 3000, 3000, 600 -> sorted 600, 2000, 3000, 3000, 4000
    assert same(s.itl, 5, 2520.0, 3000.0, 3600.0, 3960.0)
    assert same(s.e2e, 1, 17500.0, 17500.0, 17500.0, 17500.0)


def test_empty_distribution_is_nan_with_zero_count() -> None:
    d = distribution([])
    assert d.count == 0 and all(math.isnan(x) for x in (d.mean, d.p50, d.p90, d.p99))
    s = summarize_latencies({})
    assert s.requests == 0 and s.ttft.count == 0
