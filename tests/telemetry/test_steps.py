"""Throughput, gauges and window sums from StepRecords."""

from __future__ import annotations

import pytest

from telemetry.metrics import (
    StepGauges,
    StepTotals,
    record_end_ns,
    step_gauges,
    step_totals,
    tokens_per_second,
)
from telemetry.records import Span, StepRecord

MS = 1_000_000


def rec(step: int, end_ms: float | None, prefill: int, decode: int, **kw) -> StepRecord:
    spans = (
        []
        if end_ms is None
        else [
            Span("cpu.prepare", int((end_ms - 2) * MS), int((end_ms - 1) * MS)),
            Span("d2h", int((end_ms - 0.5) * MS), int(end_ms * MS)),
            Span("compute", int((end_ms - 1) * MS), int((end_ms - 0.5) * MS)),
        ]
    )
    return StepRecord(step, "async", step % 2, 2, prefill, decode, spans=spans, **kw)


RECORDS = [
    rec(
        0, 10, 512, 0, padded_tokens=0, waiting=5, running=2, kv_blocks_used=10, kv_blocks_total=100
    ),
    rec(1, 20, 0, 32, padded_tokens=0, graph_bucket=32, waiting=3, preemptions=1),
    rec(
        3,
        40,
        100,
        30,
        padded_tokens=30,
        graph_bucket=160,
        waiting=0,
        running=4,
        kv_blocks_used=25,
        kv_blocks_total=100,
        preemptions=2,
    ),
    rec(2, 30, 0, 32, graph_bucket=32, waiting=7),
    rec(4, None, 1000, 1000),  # no spans: no time
]


def test_record_end_is_the_latest_span_end() -> None:
    assert record_end_ns(RECORDS[0]) == 10 * MS
    assert record_end_ns(RECORDS[4]) is None


def test_tokens_per_second_counts_steps_ending_in_window() -> None:
    # [0, 40ms) holds steps ending at 10, 20, 30 ms (40 is excluded: half-open).
    # tokens 512 + 32 + 32 = 576 over 0.04 s = 14,400 tok/s.
    assert tokens_per_second(RECORDS, 0, 40 * MS) == pytest.approx(14_400.0)
    assert tokens_per_second(RECORDS, 0, 40 * MS, which="prefill") == pytest.approx(12_800.0)
    assert tokens_per_second(RECORDS, 0, 40 * MS, which="decode") == pytest.approx(1_600.0)
    # (15, 45] ms: steps at 20, 30, 40 -> 32 + 32 + 130 = 194 tokens over 30 ms.
    assert tokens_per_second(RECORDS, 15 * MS, 45 * MS) == pytest.approx(194 / 0.030)
    assert tokens_per_second(RECORDS, 5 * MS, 5 * MS) == 0.0
    with pytest.raises(ValueError, match="which"):
        tokens_per_second(RECORDS, 0, 1, which="padded")  # type: ignore[arg-type]


def test_gauges_come_from_the_highest_step_number() -> None:
    g = step_gauges(RECORDS[:4])
    assert g == StepGauges(step=3, running=4, waiting=0, kv_blocks_used=25, kv_blocks_total=100)
    assert g.kv_usage == 0.25
    assert step_gauges([]) is None
    assert StepGauges(0, 0, 0, 0, 0).kv_usage == 0.0


def test_totals_over_all_and_over_a_window() -> None:
    assert step_totals(RECORDS) == StepTotals(
        steps=5,
        preemptions=3,
        prefill_tokens=1612,
        decode_tokens=1094,
        padded_tokens=30,
        graph_steps=3,
        max_waiting=7,
    )
    t = step_totals(RECORDS, 15 * MS, 45 * MS)  # steps 1, 3, 2
    assert t == StepTotals(
        steps=3,
        preemptions=3,
        prefill_tokens=100,
        decode_tokens=94,
        padded_tokens=30,
        graph_steps=3,
        max_waiting=7,
    )
    assert t.padding_fraction == 30 / 224
    assert step_totals([]).padding_fraction == 0.0
