"""Exporters: Chrome trace JSON (Perfetto, chrome://tracing) and JSON lines.

Owns the on-disk shapes of telemetry. The trace has one process (the engine) with one named
thread row per lane, in LANES order; every span is a complete event (``ph: "X"``) with
``ts``/``dur`` in microseconds and its step's facts in ``args``. JSON lines hold one object
per record or event, with the record's field names.

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
# tid per lane, 1-based in LANES order (tid 0 reads as "no thread" in some viewers).
LANE_TIDS: dict[str, int] = {lane: i + 1 for i, lane in enumerate(LANES)}


def _lane_tid(lane: str, extra: dict[str, int]) -> int:
    tid = LANE_TIDS.get(lane)
    if tid is None:  # a lane we do not know yet still gets its own row, after ours
        tid = extra.setdefault(lane, len(LANES) + 1 + len(extra))
    return tid


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": ENGINE_PID, "tid": tid, "args": args}


def _metadata(lanes: dict[str, int]) -> list[dict[str, Any]]:
    events = [_meta("process_name", 0, {"name": ENGINE_PROCESS_NAME})]
    for lane, tid in lanes.items():
        events.append(_meta("thread_name", tid, {"name": lane}))
        events.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
    return events


def chrome_trace(records: Iterable[StepRecord]) -> dict[str, Any]:
    """The Chrome trace event format (JSON object form) of the records' spans.

    Every lane in LANES gets a named row even when it has no span, so traces from different
    runs line up. Timestamps are perf_counter_ns / 1000 (microseconds, fractional).
    """
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
        }
        name = f"step {rec.step}"
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
    return {"traceEvents": _metadata(lanes) + spans, "displayTimeUnit": "ms"}


def _dumps(obj: Any) -> bytes:
    if orjson is not None:
        return orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def chrome_trace_json(records: Iterable[StepRecord]) -> bytes:
    """chrome_trace serialised to UTF-8 JSON bytes (write them to a ``.json`` file)."""
    return _dumps(chrome_trace(records))


def write_chrome_trace(path: str | Path, records: Iterable[StepRecord]) -> Path:
    path = Path(path)
    path.write_bytes(chrome_trace_json(records))
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
