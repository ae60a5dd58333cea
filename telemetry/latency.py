"""Request latency figures from RequestEvents: TTFT, inter-token latency, end-to-end.

Owns how a request's life (queued -> scheduled -> first_token -> tokens... -> finished) turns
into latency numbers, per request and aggregated. Pure functions; all times are host-clock
nanoseconds as the events carry them.

It must never read the bus or a clock, and never guess a missing event's time: a figure
whose events are missing is None (per request) and left out of aggregates.

Token counting contract (what the engine must publish):
- each emitted token is counted exactly once, by the ``num_tokens`` of either a "tokens"
  event or the "first_token" event (a "first_token" with num_tokens=0 is a pure marker);
- the first token's time is the "first_token" event's time, or, without one, the time of
  the first token-carrying event.
Inter-token latency is measured per token: a token-carrying event at time t that brings k
tokens after the previous token-carrying event at t_prev gives k samples of (t - t_prev)/k
(tokens delivered together share the wait). Tokens that arrive with the first token give no
sample. With one token per event this is the usual gap between consecutive tokens, and the
mean equals (t_last - t_first) / (output_tokens - 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from telemetry.records import RequestEvent


@dataclass(slots=True, frozen=True)
class Distribution:
    """Summary of a sample. Empty samples have count 0 and NaN statistics."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float


def distribution(values: Iterable[float] | np.ndarray) -> Distribution:
    """Mean and p50/p90/p99 (numpy's linear interpolation) of ``values``."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=float)
    if arr.size == 0:
        nan = float("nan")
        return Distribution(0, nan, nan, nan, nan)
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Distribution(int(arr.size), float(arr.mean()), float(p50), float(p90), float(p99))


@dataclass(slots=True, frozen=True)
class RequestLatency:
    """One request's latency figures in nanoseconds; None where its events are missing."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    queue_ns: int | None  # queued -> scheduled
    ttft_ns: int | None  # queued -> first token
    e2e_ns: int | None  # queued -> finished
    itl_ns: tuple[float, ...]  # one inter-token latency sample per token after the first
    finish_reason: str | None  # None while the request is still running

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def itl(self) -> Distribution:
        return distribution(self.itl_ns)


def _one_request(request_id: str, events: list[RequestEvent]) -> RequestLatency:
    events.sort(key=lambda e: e.t_ns)
    queued = scheduled = first_token = finished = None
    prompt_tokens = 0
    batches: list[tuple[int, int]] = []  # (t_ns, tokens) of token-carrying events
    for ev in events:
        if ev.kind == "queued" and queued is None:
            queued = ev
        elif ev.kind == "scheduled" and scheduled is None:
            scheduled = ev
        elif ev.kind == "first_token" and first_token is None:
            first_token = ev
        elif ev.kind == "finished" and finished is None:
            finished = ev
        if ev.prompt_tokens:
            prompt_tokens = max(prompt_tokens, ev.prompt_tokens)
        if ev.kind in ("first_token", "tokens") and ev.num_tokens > 0:
            batches.append((ev.t_ns, ev.num_tokens))

    t_first = first_token.t_ns if first_token is not None else (batches[0][0] if batches else None)
    itl: list[float] = []
    prev_t: int | None = None
    for t, k in batches:
        if prev_t is not None:
            itl.extend([(t - prev_t) / k] * k)
        prev_t = t

    t0 = queued.t_ns if queued is not None else None
    return RequestLatency(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        output_tokens=sum(k for _, k in batches),
        queue_ns=scheduled.t_ns - t0 if t0 is not None and scheduled is not None else None,
        ttft_ns=t_first - t0 if t0 is not None and t_first is not None else None,
        e2e_ns=finished.t_ns - t0 if t0 is not None and finished is not None else None,
        itl_ns=tuple(itl),
        finish_reason=(finished.reason or "unknown") if finished is not None else None,
    )


def request_latencies(events: Iterable[RequestEvent]) -> dict[str, RequestLatency]:
    """Latency figures of every request seen in ``events`` (any order), keyed by id."""
    by_id: dict[str, list[RequestEvent]] = defaultdict(list)
    for ev in events:
        by_id[ev.request_id].append(ev)
    return {rid: _one_request(rid, evs) for rid, evs in by_id.items()}


@dataclass(slots=True, frozen=True)
class LatencySummary:
    """Aggregates over requests, in nanoseconds. ITL pools every token of every request."""

    requests: int
    finished: int
    output_tokens: int
    queue: Distribution
    ttft: Distribution
    itl: Distribution
    e2e: Distribution


def summarize_latencies(latencies: Mapping[str, RequestLatency]) -> LatencySummary:
    """Distributions over requests of queue time, TTFT and end-to-end latency (requests
    missing the events are left out), and of ITL over all tokens of all requests."""
    lats = list(latencies.values())
    itl = [x for lat in lats for x in lat.itl_ns]
    return LatencySummary(
        requests=len(lats),
        finished=sum(1 for lat in lats if lat.finished),
        output_tokens=sum(lat.output_tokens for lat in lats),
        queue=distribution([lat.queue_ns for lat in lats if lat.queue_ns is not None]),
        ttft=distribution([lat.ttft_ns for lat in lats if lat.ttft_ns is not None]),
        itl=distribution(itl),
        e2e=distribution([lat.e2e_ns for lat in lats if lat.e2e_ns is not None]),
    )
