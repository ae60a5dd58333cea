"""Requests page rows and histograms from hand-made request events."""

from __future__ import annotations

import pytest

from telemetry.latency import request_latencies
from telemetry.records import RequestEvent
from ui.figures.histograms import latency_histograms, latency_samples, request_rows

MS = 1_000_000


def events() -> list[RequestEvent]:
    ev = RequestEvent
    return [
        # a: queued at 0, first token at 10 ms, then 2 more 5 ms apart, finished at 20 ms
        ev("a", "queued", 0, prompt_tokens=7),
        ev("a", "scheduled", 1 * MS),
        ev("a", "first_token", 10 * MS, num_tokens=1),
        ev("a", "tokens", 15 * MS, num_tokens=1),
        ev("a", "tokens", 20 * MS, num_tokens=1),
        ev("a", "finished", 20 * MS, reason="length"),
        # b: running, one token so far
        ev("b", "queued", 5 * MS, prompt_tokens=3),
        ev("b", "scheduled", 6 * MS),
        ev("b", "first_token", 25 * MS, num_tokens=1),
        # c: still waiting
        ev("c", "queued", 30 * MS, prompt_tokens=4),
    ]


def test_rows_have_status_lengths_and_latencies_in_ms_newest_first() -> None:
    rows = request_rows(request_latencies(events()))
    assert [r["request"] for r in rows] == ["c", "b", "a"]
    c, b, a = rows
    assert (a["status"], b["status"], c["status"]) == ("length", "running", "waiting")
    assert (a["prompt tokens"], a["output tokens"]) == (7, 3)
    assert a["TTFT ms"] == pytest.approx(10.0)
    assert a["ITL mean ms"] == pytest.approx(5.0)
    assert a["e2e ms"] == pytest.approx(20.0)
    assert b["e2e ms"] is None and b["ITL mean ms"] is None
    assert c["TTFT ms"] is None


def test_histograms_hold_one_sample_per_request_or_token() -> None:
    lats = request_latencies(events())
    samples = latency_samples(lats)
    assert sorted(samples["ttft"]) == pytest.approx([10.0, 20.0])
    assert list(samples["itl"]) == pytest.approx([5.0, 5.0])
    assert list(samples["e2e"]) == pytest.approx([20.0])
    fig = latency_histograms(lats)
    assert len(fig.data) == 3
    assert "n=2" in fig.layout.annotations[0].text
    assert list(fig.data[2].x) == pytest.approx([20.0])


def test_no_requests_draws_empty_histograms() -> None:
    fig = latency_histograms({})
    assert all(len(t.x) == 0 for t in fig.data)
    assert "no samples yet" in fig.layout.annotations[0].text
