"""Exporters: Chrome trace JSON (Perfetto, chrome://tracing) and JSON lines.

Owns the on-disk shapes of telemetry. The trace has one process (the engine) with one named
thread row per lane, in LANES order; every span is a complete event (``ph: "X"``) with
``ts``/``dur`` in microseconds and its step's facts in ``args`` (its slot facts too); a step
that async mode read alone has an instant event ("read alone: <reason>") where the CPU read
it. A second process ("requests") has one track per request that rode the steps (the
records' ``chunks``): an event per step it rode, over that step's compute span (its whole span
when it has none), with the tokens it computed there; given the request events, also its time
in queue and its end.
JSON lines hold one object per record or event, with the record's field names.

It must never import a UI library, never read the bus itself (callers hand over records),
and never change a record.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from telemetry.records import LANES, RequestEvent, StepRecord

try:  # orjson is 5-10x faster; json is the fallback so export never needs it
    import orjson
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    orjson = None  # type: ignore[assignment]

ENGINE_PID = 1
ENGINE_PROCESS_NAME = "gapless engine"
REQUESTS_PID = 2
REQUESTS_PROCESS_NAME = "requests"
# tid per lane, 1-based in LANES order (tid 0 reads as "no thread" in some viewers).
LANE_TIDS: dict[str, int] = {lane: i + 1 for i, lane in enumerate(LANES)}


def _lane_tid(lane: str, extra: dict[str, int]) -> int:
    tid = LANE_TIDS.get(lane)
    if tid is None:  # a lane we do not know yet still gets its own row, after ours
        tid = extra.setdefault(lane, len(LANES) + 1 + len(extra))
    return tid


def _meta(name: str, tid: int, args: dict[str, Any], pid: int = ENGINE_PID) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _metadata(lanes: dict[str, int]) -> list[dict[str, Any]]:
    events = [_meta("process_name", 0, {"name": ENGINE_PROCESS_NAME})]
    for lane, tid in lanes.items():
        events.append(_meta("thread_name", tid, {"name": lane}))
        events.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
    return events


def _step_extent(rec: StepRecord) -> tuple[int, int] | None:
    """(start, end) of the step's compute span, else of all its spans; None without spans."""
    compute = [s for s in rec.spans if s.lane == "compute"]
    spans = compute or rec.spans
    if not spans:
        return None
    return min(s.start_ns for s in spans), max(s.end_ns for s in spans)


def request_tracks(records: Iterable[StepRecord],
                   events: Iterable[RequestEvent] = ()) -> list[dict[str, Any]]:
    """The "requests" process: one named track per request, in order of first appearance."""
    tids: dict[str, int] = {}
    out: list[dict[str, Any]] = []

    def tid(rid: str) -> int:
        t = tids.get(rid)
        if t is None:
            t = tids[rid] = len(tids) + 1
        return t

    def x(rid: str, name: str, start: int, end: int, args: dict[str, Any]) -> None:
        out.append({"ph": "X", "name": name, "cat": "request", "pid": REQUESTS_PID,
                    "tid": tid(rid), "ts": start / 1000.0, "dur": (end - start) / 1000.0,
                    "args": args})

    for rec in records:
        extent = _step_extent(rec) if rec.chunks else None
        if extent is None:
            continue
        total = max(1, sum(c[1] for c in rec.chunks))
        for rid, n, context in rec.chunks:
            x(rid, f"step {rec.step}", *extent,
              {"request_id": rid, "step": rec.step, "tokens": n, "context": context,
               "share": n / total})
    queued: dict[str, int] = {}
    for ev in events:
        if ev.kind == "queued":
            queued[ev.request_id] = ev.t_ns
        elif ev.kind == "scheduled" and ev.request_id in queued and ev.request_id in tids:
            x(ev.request_id, "queued", queued.pop(ev.request_id), ev.t_ns,
              {"request_id": ev.request_id, "prompt_tokens": ev.prompt_tokens})
        elif ev.kind == "finished" and ev.request_id in tids:
            out.append({"ph": "i", "s": "t", "name": f"finished: {ev.reason}",
                        "cat": "request", "pid": REQUESTS_PID, "tid": tids[ev.request_id],
                        "ts": ev.t_ns / 1000.0,
                        "args": {"request_id": ev.request_id, "reason": ev.reason,
                                 "cached_tokens": ev.cached_tokens,
                                 "preemptions": ev.preemptions}})
    if not tids:
        return []
    meta = [_meta("process_name", 0, {"name": REQUESTS_PROCESS_NAME}, REQUESTS_PID),
            _meta("process_sort_index", 0, {"sort_index": REQUESTS_PID}, REQUESTS_PID)]
    for rid, t in tids.items():
        meta.append(_meta("thread_name", t, {"name": rid}, REQUESTS_PID))
        meta.append(_meta("thread_sort_index", t, {"sort_index": t}, REQUESTS_PID))
    return meta + out


def chrome_trace(records: Iterable[StepRecord],
                 events: Iterable[RequestEvent] = ()) -> dict[str, Any]:
    """The Chrome trace event format (JSON object form) of the records' spans, and a track
    per request (request_tracks; the request events add its queue time and its end).

    Every lane in LANES gets a named row even when it has no span, so traces from different
    runs line up. Timestamps are perf_counter_ns / 1000 (microseconds, fractional).
    """
    records = list(records)
    extra: dict[str, int] = {}
    spans: list[dict[str, Any]] = []
    for rec in records:
        args = {
            "step": rec.step,
            "mode": rec.mode,
            "slot": rec.slot,
            "num_requests": rec.num_requests,
            "prefill_tokens": rec.prefill_tokens,
            "decode_tokens": rec.decode_tokens,
            "padded_tokens": rec.padded_tokens,
            "graph_bucket": rec.graph_bucket,
            "input_wait_us": None if rec.input_wait_ns is None else rec.input_wait_ns / 1000.0,
            "slot_wait_us": rec.slot_wait_ns / 1000.0,
            "sync_fallback": rec.sync_fallback,
        }
        name = f"step {rec.step}"
        if rec.sync_fallback is not None and rec.spans:  # a mark where the CPU read it
            read = [s for s in rec.spans if s.lane == "cpu.wait"] or rec.spans
            spans.append({"ph": "i", "s": "t", "name": f"read alone: {rec.sync_fallback}",
                          "cat": "sync_fallback", "pid": ENGINE_PID,
                          "tid": _lane_tid(read[0].lane, extra), "ts": read[0].end_ns / 1000.0,
                          "args": args})
        for span in rec.spans:
            spans.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": span.lane,
                    "pid": ENGINE_PID,
                    "tid": _lane_tid(span.lane, extra),
                    "ts": span.start_ns / 1000.0,
                    "dur": (span.end_ns - span.start_ns) / 1000.0,
                    "args": args,  # shared per step: the serialiser writes it per event
                }
            )
    lanes = dict(LANE_TIDS)
    lanes.update(extra)
    return {"traceEvents": _metadata(lanes) + spans + request_tracks(records, events),
            "displayTimeUnit": "ms"}


def _dumps(obj: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def chrome_trace_json(records: Iterable[StepRecord],
                      events: Iterable[RequestEvent] = ()) -> bytes:
    """chrome_trace serialised to UTF-8 JSON bytes (write them to a ``.json`` file)."""
    return _dumps(chrome_trace(records, events))


def write_chrome_trace(path: str | Path, records: Iterable[StepRecord],
                       events: Iterable[RequestEvent] = ()) -> Path:
    path = Path(path)
    path.write_bytes(chrome_trace_json(records, events))
    return path


def record_to_dict(item: StepRecord | RequestEvent) -> dict[str, Any]:
    """A record as a plain dict with a ``type`` tag ("step" or "event"); spans nested."""
    if isinstance(item, StepRecord):
        kind = "step"
    elif isinstance(item, RequestEvent):
        kind = "event"
    else:
        raise TypeError(f"expected StepRecord or RequestEvent, got {type(item).__name__}")
    return {"type": kind, **dataclasses.asdict(item)}


def to_jsonl(items: Iterable[StepRecord | RequestEvent]) -> str:
    """One JSON object per line (see record_to_dict); empty input gives ""."""
    return "".join(_dumps(record_to_dict(it)).decode() + "\n" for it in items)


def write_jsonl(path: str | Path, items: Iterable[StepRecord | RequestEvent]) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for it in items:
            f.write(_dumps(record_to_dict(it)).decode())
            f.write("\n")
    return path
