"""A step's end has one definition, StepRecord.end_ns (its latest span's end: the CPU's post-
processing after its tokens arrived), and what places a step in time asks it: the window
figures (record_end_ns), the request ledger's steps, the benchmark driver's run window and
the bench suites."""

from __future__ import annotations

import re
from pathlib import Path

from telemetry.ledger import LedgerEntry, steps_of
from telemetry.metrics import record_end_ns
from telemetry.records import Span, StepRecord

ROOT = Path(__file__).resolve().parents[2]
# A step's end computed again from a record's spans (one record's, or the latest of several
# records'), instead of asking StepRecord.end_ns.
SECOND_DEFINITION = re.compile(
    r"max\(\s*\w+\.end_ns\s+for\s+(\w+\s+in\s+\w+\s+for\s+)?\w+\s+in\s+\w+\.spans\b")
# Where the scan looks: everything that reads steps.
SCANNED = ("telemetry", "engine", "bench", "ui")


def _rec(step: int, spans: list[tuple[str, int, int]]) -> StepRecord:
    return StepRecord(step=step, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, spans=[Span(*s) for s in spans])


def test_a_step_ends_with_its_latest_span_whichever_lane_it_is():
    # async: the step's post runs after the next step's launch, after its own d2h
    rec = _rec(3, [("cpu.launch", 0, 10), ("compute", 20, 90), ("d2h", 90, 95),
                   ("cpu.wait", 60, 96), ("cpu.post", 96, 120)])
    assert rec.end_ns == 120 == record_end_ns(rec)
    assert _rec(4, []).end_ns is None and record_end_ns(_rec(4, [])) is None


def test_the_ledger_finds_a_requests_steps_by_that_end():
    early = _rec(1, [("compute", 0, 50), ("cpu.post", 50, 60)])
    late = _rec(2, [("compute", 70, 90), ("cpu.post", 90, 100)])
    entry = LedgerEntry("r")
    entry.first_step_ns, entry.last_step_ns = 95, 200
    assert steps_of(entry, [early, late]) == [late]


def test_a_steps_end_is_defined_once():
    found = [f"{p.relative_to(ROOT)}:{n}" for top in SCANNED
             for p in sorted((ROOT / top).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if SECOND_DEFINITION.search(line) and p != ROOT / "telemetry" / "records.py"]
    assert not found, f"a second definition of a step's end: {found}"


def test_the_scan_finds_a_second_definition_in_either_form():
    assert SECOND_DEFINITION.search("if r.spans and max(s.end_ns for s in r.spans) > start")
    assert SECOND_DEFINITION.search("end = max(s.end_ns for r in recs for s in r.spans)")
    assert not SECOND_DEFINITION.search("end = max(r.end_ns for r in recs)")
    assert not SECOND_DEFINITION.search("hi = max(s.end_ns for s in comp)")  # spans of a lane
