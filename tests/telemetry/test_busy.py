"""Busy fraction and idle gaps on hand-made spans; values worked out by hand."""

from __future__ import annotations

import random

import pytest

from telemetry.metrics import GapStats, busy_fraction, busy_intervals, idle_gaps, spans_of
from telemetry.records import Span, StepRecord

# compute: [100,200) and [150,300) overlap -> [100,300); [400,500) and [500,550) touch ->
# [400,550). Union length 200 + 150 = 350. The h2d span covers everything and must not count.
SPANS = [
    Span("compute", 400, 500),
    Span("compute", 150, 300),
    Span("h2d", 0, 1000),
    Span("compute", 100, 200),
    Span("compute", 500, 550),
    Span("compute", 2000, 3000),  # wholly after the window below
]


def test_union_merges_overlap_and_touching_spans() -> None:
    starts, ends = busy_intervals(SPANS, 0, 1000)
    assert starts.tolist() == [100, 400]
    assert ends.tolist() == [300, 550]


def test_busy_fraction_counts_overlap_once() -> None:
    assert busy_fraction(SPANS, 0, 1000) == 0.35


def test_busy_fraction_uses_only_the_asked_lane() -> None:
    assert busy_fraction(SPANS, 0, 1000, lane="h2d") == 1.0
    assert busy_fraction(SPANS, 0, 1000, lane="d2h") == 0.0


def test_idle_gaps_include_leading_and_trailing_idle() -> None:
    # leading 0->100 (100), between 300->400 (100), trailing 550->1000 (450)
    assert idle_gaps(SPANS, 0, 1000) == GapStats(count=3, total_ns=650, largest_ns=450)


def test_window_clipping() -> None:
    # [160,450): compute [160,300) = 140 and [400,450) = 50 -> 190 of 290
    assert busy_fraction(SPANS, 160, 450) == 190 / 290
    assert idle_gaps(SPANS, 160, 450) == GapStats(1, 100, 100)
    # a window inside one busy interval is fully busy with no gap
    assert busy_fraction(SPANS, 120, 280) == 1.0
    assert idle_gaps(SPANS, 120, 280) == GapStats(0, 0, 0)


def test_busy_plus_idle_is_the_window() -> None:
    for lo, hi in [(0, 1000), (160, 450), (250, 2500), (0, 5000)]:
        starts, ends = busy_intervals(SPANS, lo, hi)
        assert int((ends - starts).sum()) + idle_gaps(SPANS, lo, hi).total_ns == hi - lo


def test_empty_inputs() -> None:
    assert busy_fraction([], 0, 10) == 0.0
    assert idle_gaps([], 0, 10) == GapStats(1, 10, 10)  # one gap: the whole window
    # a zero-length window has nothing to be busy or idle in
    assert busy_fraction(SPANS, 150, 150) == 0.0
    assert idle_gaps(SPANS, 150, 150) == GapStats(0, 0, 0)
    # spans only outside the window
    assert busy_fraction(SPANS, 600, 1900) == 0.0
    assert idle_gaps(SPANS, 600, 1900) == GapStats(1, 1300, 1300)


def test_reversed_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="before its start"):
        busy_fraction(SPANS, 10, 5)
    with pytest.raises(ValueError, match="before its start"):
        idle_gaps(SPANS, 10, 5)


def test_spans_of_flattens_records() -> None:
    recs = [
        StepRecord(0, "sync", 0, 1, 4, 0, spans=[Span("h2d", 0, 1), Span("compute", 1, 5)]),
        StepRecord(1, "sync", 1, 1, 0, 1, spans=[Span("compute", 6, 9)]),
    ]
    assert [s.lane for s in spans_of(recs)] == ["h2d", "compute", "compute"]
    assert busy_fraction(spans_of(recs), 0, 10) == 0.7


def test_matches_brute_force_on_random_spans() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(0, 12)):
            a = rng.randint(0, 90)
            spans.append(Span("compute", a, a + rng.randint(0, 15)))
        lo = rng.randint(0, 60)
        hi = lo + rng.randint(1, 50)
        busy = [False] * 200
        for s in spans:
            for t in range(s.start_ns, s.end_ns):
                busy[t] = True
        window = busy[lo:hi]
        # gaps by brute force: maximal runs of idle ticks inside the window
        runs, run = [], 0
        for b in window + [True]:
            if b:
                if run:
                    runs.append(run)
                run = 0
            else:
                run += 1
        assert busy_fraction(spans, lo, hi) == sum(window) / (hi - lo)
        assert idle_gaps(spans, lo, hi) == GapStats(len(runs), sum(runs), max(runs, default=0))
