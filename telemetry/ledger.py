"""The request ledger: what each finished request cost, joined to the engine steps it rode.

Owns pure functions over recorded telemetry (StepRecords with their `chunks`, and
RequestEvents): per request, time in queue, prefill and decode steps (ids, for the timeline),
its share of those steps' device time (by its share of each step's tokens), bytes of KV it
read, cached prompt tokens, preemptions, finish reason. Imports nothing of ours but records;
never imports a UI library and never reads the bus itself (callers hand over what they read).

The figures cover the steps handed over: a request whose early steps fell out of the bus's
ring is marked ``partial`` (its queue entry is missing), and its shares then count only the
steps that are left. In async mode a request that stopped at step N may ride step N+1 too
(its token there is computed one step late and discarded): that step is counted, since the
device did the work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from telemetry.records import RequestEvent, StepRecord


@dataclass(slots=True)
class LedgerEntry:
    request_id: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    queued_ns: int | None = None
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None
    finish_reason: str | None = None
    prefill_steps: list[int] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)
    device_ns: float = 0.0  # its token share of each step's compute span
    kv_bytes_read: int = 0
    preemptions: int = 0
    first_step_ns: int | None = None  # the earliest span start of the steps it rode
    last_step_ns: int | None = None  # the latest span end of the steps it rode

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    @property
    def partial(self) -> bool:
        """The window handed over starts after this request was queued."""
        return self.queued_ns is None

    @property
    def steps(self) -> list[int]:
        return sorted(self.prefill_steps + self.decode_steps)

    @property
    def queue_s(self) -> float | None:
        if self.queued_ns is None or self.scheduled_ns is None:
            return None
        return (self.scheduled_ns - self.queued_ns) / 1e9

    @property
    def ttft_s(self) -> float | None:
        if self.queued_ns is None or self.first_token_ns is None:
            return None
        return (self.first_token_ns - self.queued_ns) / 1e9

    @property
    def e2e_s(self) -> float | None:
        if self.queued_ns is None or self.finished_ns is None:
            return None
        return (self.finished_ns - self.queued_ns) / 1e9

    def to_dict(self) -> dict:
        return {"request_id": self.request_id, "finished": self.finished,
                "finish_reason": self.finish_reason, "partial": self.partial,
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "output_tokens": self.output_tokens, "queue_s": self.queue_s,
                "ttft_s": self.ttft_s, "e2e_s": self.e2e_s,
                "prefill_steps": self.prefill_steps, "decode_steps": self.decode_steps,
                "device_s": self.device_ns / 1e9, "kv_bytes_read": self.kv_bytes_read,
                "preemptions": self.preemptions}


def step_device_ns(rec: StepRecord) -> int:
    """A step's device time: its compute spans (rank 0's lane)."""
    return sum(s.end_ns - s.start_ns for s in rec.spans if s.lane == "compute")


def _on_event(e: LedgerEntry, ev: RequestEvent) -> None:
    e.prompt_tokens = ev.prompt_tokens or e.prompt_tokens
    if ev.kind == "queued":
        e.queued_ns = ev.t_ns
    elif ev.kind == "scheduled":
        if e.scheduled_ns is None:
            e.scheduled_ns = ev.t_ns
    elif ev.kind in ("first_token", "tokens"):
        e.output_tokens += ev.num_tokens
        if e.first_token_ns is None:
            e.first_token_ns = ev.t_ns
    elif ev.kind == "finished":
        e.finished_ns, e.finish_reason = ev.t_ns, ev.reason
        e.cached_tokens, e.preemptions = ev.cached_tokens, ev.preemptions


def build_ledger(records: Iterable[StepRecord], events: Iterable[RequestEvent],
                 kv_bytes_per_token: int = 0,
                 only: set[str] | None = None) -> dict[str, LedgerEntry]:
    """Entries by request id for every request seen in `records` or `events` (or only those
    in `only`). A request's chunk of a step is prefill when it computes more than one token
    or its context is within its prompt, decode otherwise; each step's device time is split
    by token share, so the shares of a set of steps add up to those steps' device time. KV
    read: a chunk's whole context (cached prefix included), each step."""
    out: dict[str, LedgerEntry] = {}
    if only is not None:
        events = [ev for ev in events if ev.request_id in only]

    def entry(rid: str) -> LedgerEntry:
        e = out.get(rid)
        if e is None:
            e = out[rid] = LedgerEntry(rid)
        return e

    for ev in events:
        _on_event(entry(ev.request_id), ev)
    # The hot loop (a chunk per request per step: a million at batch 256 over 4,096 steps):
    # locals only, and the step's extent applied once per request, not per chunk.
    get = out.get
    for rec in records:
        chunks = rec.chunks
        if not chunks:
            continue
        total = sum(c[1] for c in chunks)
        if not total:
            continue
        per_token = step_device_ns(rec) / total
        step = rec.step
        spans = rec.spans
        start = min(s.start_ns for s in spans) if spans else None
        end = rec.end_ns
        for rid, n, context in chunks:
            e = get(rid)
            if e is None:
                if only is not None and rid not in only:
                    continue
                e = entry(rid)
            if n > 1 or context <= e.prompt_tokens:
                e.prefill_steps.append(step)
            else:
                e.decode_steps.append(step)
            e.device_ns += per_token * n
            e.kv_bytes_read += context * kv_bytes_per_token
            if start is not None:
                if e.first_step_ns is None or start < e.first_step_ns:
                    e.first_step_ns = start
                if e.last_step_ns is None or end > e.last_step_ns:  # type: ignore[operator]
                    e.last_step_ns = end
    return out


def request_ledger(records: Iterable[StepRecord], events: Iterable[RequestEvent],
                   request_id: str, kv_bytes_per_token: int = 0) -> LedgerEntry | None:
    """One request's entry, or None when neither the steps nor the events know it."""
    return build_ledger(records, events, kv_bytes_per_token, only={request_id}).get(request_id)


def window_device_ns(records: Iterable[StepRecord]) -> int:
    return sum(step_device_ns(r) for r in records)


def slowest_first(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """Finished requests, the longest end-to-end first (unknown latencies last)."""
    done = [e for e in entries if e.finished]
    return sorted(done, key=lambda e: -(e.e2e_s if e.e2e_s is not None else -1.0))


def steps_of(entry: LedgerEntry, records: Iterable[StepRecord]) -> list[StepRecord]:
    """Every step that ran while ``entry`` was on its steps (its own and its neighbours'),
    publish order kept: what the timeline shows for it."""
    lo, hi = entry.first_step_ns, entry.last_step_ns
    if lo is None or hi is None:
        return []
    return [r for r in records if r.spans and min(s.start_ns for s in r.spans) <= hi
            and r.end_ns >= lo]  # type: ignore[operator]  (r.spans: an end)
