"""The request ledger: what each finished request cost, joined to the engine steps it rode.

Owns one pure function over recorded telemetry (StepRecords with their `chunks`, and
RequestEvents): per request, time in queue, prefill and decode steps (ids, for the timeline),
its share of those steps' device time (by its share of each step's tokens), bytes of KV it
read, cached prompt tokens, preemptions, finish reason. Imports nothing of ours but records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from telemetry.records import RequestEvent, StepRecord


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    queued_ns: int | None = None
    scheduled_ns: int | None = None
    finished_ns: int | None = None
    finish_reason: str | None = None
    prefill_steps: list[int] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)
    device_ns: float = 0.0  # its token share of each step's compute span
    kv_bytes_read: int = 0
    preemptions: int = 0

    @property
    def queue_s(self) -> float | None:
        if self.queued_ns is None or self.scheduled_ns is None:
            return None
        return (self.scheduled_ns - self.queued_ns) / 1e9

    @property
    def e2e_s(self) -> float | None:
        if self.queued_ns is None or self.finished_ns is None:
            return None
        return (self.finished_ns - self.queued_ns) / 1e9

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "queue_s": self.queue_s,
                "e2e_s": self.e2e_s, "finish_reason": self.finish_reason,
                "prefill_steps": self.prefill_steps, "decode_steps": self.decode_steps,
                "device_s": self.device_ns / 1e9, "kv_bytes_read": self.kv_bytes_read,
                "preemptions": self.preemptions}


def step_device_ns(rec: StepRecord) -> int:
    """A step's device time: its compute spans (rank 0's lane)."""
    return sum(s.end_ns - s.start_ns for s in rec.spans if s.lane == "compute")


def build_ledger(records: Iterable[StepRecord], events: Iterable[RequestEvent],
                 kv_bytes_per_token: int = 0) -> dict[str, LedgerEntry]:
    """Entries by request id for every request seen in `records` or `events`. A request's
    chunk of a step is prefill when it computes more than one token or its context is within
    its prompt, decode otherwise; each step's device time is split by token share, so the
    shares of a set of steps add up to those steps' device time."""
    out: dict[str, LedgerEntry] = {}

    def entry(rid: str) -> LedgerEntry:
        e = out.get(rid)
        if e is None:
            e = out[rid] = LedgerEntry(rid)
        return e

    for ev in events:
        e = entry(ev.request_id)
        e.prompt_tokens = ev.prompt_tokens or e.prompt_tokens
        if ev.kind == "queued":
            e.queued_ns = ev.t_ns
        elif ev.kind == "scheduled" and e.scheduled_ns is None:
            e.scheduled_ns = ev.t_ns
        elif ev.kind == "finished":
            e.finished_ns, e.finish_reason = ev.t_ns, ev.reason
    for rec in records:
        total = sum(n for _, n, _ in rec.chunks)
        device = step_device_ns(rec)
        for rid, n, context in rec.chunks:
            e = entry(rid)
            prefill = n > 1 or (e.prompt_tokens and context <= e.prompt_tokens)
            (e.prefill_steps if prefill else e.decode_steps).append(rec.step)
            if total:
                e.device_ns += device * n / total
            e.kv_bytes_read += context * kv_bytes_per_token
    return out


def attach_request_facts(entries: dict[str, LedgerEntry], rid: str, cached_tokens: int,
                         preemptions: int) -> None:
    """What only the finished request knows (its RequestOutput / engine request)."""
    e = entries.get(rid)
    if e is not None:
        e.cached_tokens, e.preemptions = cached_tokens, preemptions


def slowest_first(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    return sorted(entries, key=lambda e: -(e.e2e_s or 0.0))
