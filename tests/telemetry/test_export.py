"""Chrome trace JSON (one named row per lane, X events in microseconds) and JSON lines."""

from __future__ import annotations

import json

import pytest

import telemetry.export as export
from telemetry.export import chrome_trace, chrome_trace_json, to_jsonl, write_jsonl
from telemetry.records import LANES, RequestEvent, Span, StepRecord

RECORDS = [
    StepRecord(
        7,
        "async",
        1,
        3,
        40,
        2,
        padded_tokens=6,
        graph_bucket=48,
        spans=[
            Span("cpu.schedule", 1_000_000, 1_012_500),
            Span("cpu.prepare", 1_012_500, 1_030_000),
            Span("h2d", 1_031_000, 1_031_750),
            Span("compute", 1_032_000, 1_532_001),
            Span("d2h", 1_532_500, 1_533_000),
        ],
    ),
    StepRecord(
        8,
        "sync",
        0,
        1,
        0,
        1,
        spans=[
            Span("cpu.launch", 1_540_000, 1_541_000),
            Span("cpu.wait", 1_541_000, 1_600_000),
            Span("cpu.post", 1_600_000, 1_610_000),
        ],
    ),
]


def loaded(records: list[StepRecord]) -> dict:
    return json.loads(chrome_trace_json(records))


def rows(trace: dict) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


def test_every_lane_is_a_named_row_in_lanes_order() -> None:
    trace = loaded(RECORDS)
    names = rows(trace)
    assert [names[tid] for tid in sorted(names)] == list(LANES)
    sort = {
        e["tid"]: e["args"]["sort_index"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_sort_index"
    }
    assert sorted(sort, key=sort.get) == sorted(names)
    proc = [e for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert proc[0]["args"]["name"] == "gapless engine"
    assert {e["pid"] for e in trace["traceEvents"]} == {export.ENGINE_PID}
    # rows exist even with no spans at all
    assert [rows(loaded([]))[t] for t in sorted(rows(loaded([])))] == list(LANES)


def test_spans_are_x_events_in_microseconds_on_their_lane() -> None:
    trace = loaded(RECORDS)
    names = rows(trace)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 8
    for e, span in zip(xs, [s for r in RECORDS for s in r.spans], strict=True):
        assert names[e["tid"]] == span.lane == e["cat"]
        assert e["ts"] == span.start_ns / 1000
        assert e["dur"] == (span.end_ns - span.start_ns) / 1000
    compute = xs[3]
    assert (compute["ts"], compute["dur"]) == (1032.0, 500.001)
    assert compute["name"] == "step 7"


def test_step_facts_are_in_args() -> None:
    xs = [e for e in loaded(RECORDS)["traceEvents"] if e["ph"] == "X"]
    assert xs[0]["args"] == {
        "step": 7,
        "mode": "async",
        "slot": 1,
        "num_requests": 3,
        "prefill_tokens": 40,
        "decode_tokens": 2,
        "padded_tokens": 6,
        "graph_bucket": 48,
        "input_wait_us": 0.25,
        "slot_wait_us": 0.0,
        "sync_fallback": None,
    }
    assert xs[-1]["args"]["graph_bucket"] is None and xs[-1]["args"]["mode"] == "sync"


def test_unknown_lane_gets_its_own_row_after_ours() -> None:
    rec = StepRecord(0, "sync", 0, 1, 1, 0, spans=[Span("sampler", 0, 10)])
    trace = loaded([rec])
    names = rows(trace)
    x = next(e for e in trace["traceEvents"] if e["ph"] == "X")
    assert names[x["tid"]] == "sampler"
    assert x["tid"] == len(LANES) + 1


def test_json_fallback_writes_the_same_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = loaded(RECORDS)
    monkeypatch.setattr(export, "orjson", None)
    assert json.loads(chrome_trace_json(RECORDS)) == fast
    assert chrome_trace(RECORDS)["displayTimeUnit"] == "ms"


EVENTS = [
    RequestEvent("r1", "queued", 5, prompt_tokens=9),
    RequestEvent("r1", "finished", 50, num_tokens=0, reason="stop"),
]


def riding(step: int, start: int, end: int, chunks: list) -> StepRecord:
    return StepRecord(step, "async", 0, len(chunks), 0, len(chunks), chunks=chunks,
                      spans=[Span("cpu.prepare", start - 50, start),
                             Span("compute", start, end)])


def test_one_track_per_request_with_the_steps_it_rode() -> None:
    records = [riding(1, 1000, 2000, [("r1", 9, 9)]),
               riding(2, 2000, 2500, [("r1", 1, 10), ("r2", 3, 3)]),
               RECORDS[1]]  # no chunks: no request track from it
    events = [RequestEvent("r1", "queued", 100, prompt_tokens=9),
              RequestEvent("r1", "scheduled", 900, prompt_tokens=9),
              RequestEvent("r9", "queued", 100, prompt_tokens=9),  # not in these steps
              RequestEvent("r9", "scheduled", 200, prompt_tokens=9),
              RequestEvent("r1", "finished", 2600, reason="stop", cached_tokens=4)]
    trace = json.loads(chrome_trace_json(records, events))
    evs = trace["traceEvents"]
    req = [e for e in evs if e["pid"] == export.REQUESTS_PID]
    names = {e["tid"]: e["args"]["name"] for e in req
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(names.values()) == ["r1", "r2"]
    track = {rid: [e for e in req if e["ph"] != "M" and names[e["tid"]] == rid]
             for rid in names.values()}
    steps_r1 = [(e["args"]["step"], e["ts"], e["dur"], e["args"]["tokens"])
                for e in track["r1"] if e["name"].startswith("step")]
    assert steps_r1 == [(1, 1.0, 1.0, 9), (2, 2.0, 0.5, 1)]  # over each step's compute span
    assert [e["args"]["share"] for e in track["r2"]] == [0.75]
    queued = [e for e in track["r1"] if e["name"] == "queued"]
    assert [(q["ts"], q["dur"]) for q in queued] == [(0.1, 0.8)]
    end = [e for e in track["r1"] if e["ph"] == "i"]
    assert end[0]["name"] == "finished: stop" and end[0]["args"]["cached_tokens"] == 4
    # The engine's lane rows are untouched by the request tracks.
    engine_rows = [e["cat"] for e in evs if e["pid"] == export.ENGINE_PID and e["ph"] == "X"]
    assert engine_rows == [s.lane for r in records for s in r.spans]


def test_no_request_track_without_chunks() -> None:
    assert all(e["pid"] == export.ENGINE_PID for e in loaded(RECORDS)["traceEvents"])


def test_jsonl_one_object_per_record() -> None:
    text = to_jsonl([RECORDS[1], *EVENTS])
    lines = text.splitlines()
    assert len(lines) == 3 and text.endswith("\n")
    step, queued, finished = (json.loads(line) for line in lines)
    assert step["type"] == "step" and step["step"] == 8 and step["mode"] == "sync"
    assert step["spans"][1] == {"lane": "cpu.wait", "start_ns": 1_541_000, "end_ns": 1_600_000}
    assert queued == {
        "type": "event",
        "request_id": "r1",
        "kind": "queued",
        "t_ns": 5,
        "num_tokens": 0,
        "prompt_tokens": 9,
        "reason": None,
        "cached_tokens": 0,
        "preemptions": 0,
    }
    assert finished["reason"] == "stop"
    assert to_jsonl([]) == ""


def test_write_jsonl_round_trips(tmp_path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", RECORDS + EVENTS)
    assert path.read_text(encoding="utf-8") == to_jsonl(RECORDS + EVENTS)
    with pytest.raises(TypeError, match="StepRecord or RequestEvent"):
        to_jsonl([Span("compute", 0, 1)])  # type: ignore[list-item]
