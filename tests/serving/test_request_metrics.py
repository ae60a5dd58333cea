"""RequestMetrics counts a request the engine died with exactly once, whichever of its
events reached the server: its queued event and the client's finished (engine_dead) event,
the latter alone, or the queued event alone (then ``engine_gone`` counts it)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from engine.serving.request_metrics import RequestMetrics
from telemetry.records import RequestEvent


def _metrics() -> RequestMetrics:
    return RequestMetrics(CollectorRegistry(), "m", 64)


def _dead(m: RequestMetrics) -> float:
    return m.failed["engine_dead"]._value.get()


def _error(m: RequestMetrics) -> float:
    return m.failed["error"]._value.get()


def test_a_request_the_engine_died_with_counts_once_whatever_arrived():
    m = _metrics()
    m.on_event(RequestEvent("seen", "queued", 1, prompt_tokens=3))
    m.on_event(RequestEvent("seen", "finished", 5, reason="engine_dead"))
    m.on_event(RequestEvent("unseen", "finished", 5, reason="engine_dead"))
    m.on_event(RequestEvent("other-client", "queued", 2, prompt_tokens=3))
    assert (_dead(m), _error(m)) == (2, 0)
    assert m.engine_gone() == 1  # other-client's: the engine's death ended it too
    assert (_dead(m), _error(m)) == (3, 0)
    assert m.engine_gone() == 0


def test_other_unknown_endings_are_not_counted():
    m = _metrics()
    m.on_event(RequestEvent("unseen", "finished", 5, reason="error"))
    m.on_event(RequestEvent("seen", "queued", 1, prompt_tokens=3))
    m.on_event(RequestEvent("seen", "finished", 5, reason="error"))
    assert (_dead(m), _error(m)) == (0, 1)
