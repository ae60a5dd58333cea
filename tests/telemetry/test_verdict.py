"""The one A/B verdict (telemetry.verdict): decode-only steps compared with prefill apart on
the A/B and Recordings pages, alternated runs on the Benchmark page and in `python -m bench ab`,
each difference with a 95% interval that says where it comes from, in the same words."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bench.harness.ab import compare
from telemetry.records import Span, StepRecord
from telemetry.verdict import (
    compare_runs,
    covered,
    decode_steps,
    decode_verdict,
    judge,
    paired_change,
    runs_verdict,
    spread,
)

MS = 1_000_000


def run(periods_ms: list[float], *, prefill_at: tuple[int, ...] = (), prefill_ms: float = 0.0,
        busy: float = 0.9, first: int = 0) -> list[StepRecord]:
    """Serial steps: step k lasts periods_ms[k] (compute busy a ``busy`` share of it); the
    steps in ``prefill_at`` are prefill steps of ``prefill_ms`` instead."""
    out, t = [], 0
    for k, p in enumerate(periods_ms):
        pre = k in prefill_at
        length = int((prefill_ms if pre else p) * MS)
        cpu = int(length * (1 - busy))
        out.append(StepRecord(step=first + k, mode="sync", slot=0, num_requests=8,  # type: ignore[arg-type]
                              prefill_tokens=512 if pre else 0, decode_tokens=0 if pre else 8,
                              spans=[Span("cpu.prepare", t, t + cpu),
                                     Span("compute", t + cpu, t + length)]))
        t += length
    return out


def noisy(n: int, ms: float, rel: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(ms * np.exp(rel * rng.standard_normal(n)))


def test_decode_steps_leave_prefill_out_and_measure_busy() -> None:
    d = decode_steps(run([2.0] * 10, prefill_at=(3,), prefill_ms=50.0, busy=0.75))
    assert d.n == 8  # 10 steps, less the first (no period) and the prefill one
    assert d.prefill_steps == 1 and d.prefill_tokens == 512
    assert d.prefill_ns == 50 * MS
    assert d.tokens_per_s == pytest.approx(8 / 2e-3)
    assert d.busy == pytest.approx(0.75, abs=1e-6)


def test_a_large_gain_hidden_by_prefill_steps_is_named_with_its_interval() -> None:
    # B's decode steps are 1.4x faster; long prefill steps in both would widen any
    # sub-window spread (a spread-overlap rule would call it "no measurable difference").
    pre = (0, 40, 80)
    a = run(noisy(120, 2.8, 0.05, 1), prefill_at=pre, prefill_ms=60.0, busy=0.75)
    b = run(noisy(120, 2.0, 0.05, 2), prefill_at=pre, prefill_ms=60.0, busy=0.99)
    v = decode_verdict([a], [b], a_label="sync", b_label="async")
    assert v.measurable
    assert v.throughput is not None and 30 < v.throughput.lo < v.throughput.hi < 50
    assert "no measurable difference" not in v.text
    m = re.search(r"async is (\d+\.\d)% faster than sync", v.text)
    assert m and float(m.group(1)) == pytest.approx(40, abs=3)
    assert "95% interval +" in v.text and "block bootstrap" in v.text
    assert v.busy is not None and v.busy.lo > 20  # 75% -> 99% of the decode steps' time
    assert "3 steps, 1,536 prompt tokens" in v.text  # prefill apart


def test_equal_modes_are_no_measurable_difference() -> None:
    a = run(noisy(200, 2.0, 0.02, 3))
    b = run(noisy(200, 2.0, 0.02, 4))
    v = decode_verdict([a], [b], a_label="sync", b_label="async")
    assert not v.measurable
    assert "no measurable difference" in v.text
    assert v.throughput is not None and v.throughput.holds_zero()


def test_a_wide_interval_says_the_data_cannot_tell_not_no_difference() -> None:
    a = run(noisy(12, 2.0, 0.5, 5))
    b = run(noisy(12, 2.2, 0.5, 6))
    v = decode_verdict([a], [b], a_label="sync", b_label="async")
    assert not v.measurable
    assert "not settled by this data" in v.text and "no measurable difference" not in v.text


def test_alternated_runs_give_a_t_interval_over_the_pairs() -> None:
    a_runs = [run(noisy(30, 3.0 * drift, 0.03, 10 + i), first=100 * i)
              for i, drift in enumerate((1.0, 1.3, 0.9))]
    b_runs = [run(noisy(30, 2.0 * drift, 0.03, 20 + i), first=100 * i + 50)
              for i, drift in enumerate((1.0, 1.3, 0.9))]
    v = decode_verdict(a_runs, b_runs, a_label="sync", b_label="async")
    assert "t-interval over 3 alternated pairs" in v.text
    assert v.measurable and v.throughput is not None
    assert v.throughput.lo < 50 < v.throughput.hi  # 3.0 / 2.0: +50% in every pair


def test_too_few_decode_steps_is_said_not_judged() -> None:
    v = decode_verdict([run([2.0, 2.0])], [run([1.0, 1.0])], a_label="a", b_label="b")
    assert not v.measurable and v.throughput is None
    assert "too few decode-only steps" in v.text


# ------------------------------------------------------------------- runs (Benchmark page)
def test_runs_that_drift_together_are_judged_by_their_pairs() -> None:
    """Each repetition ran both modes; the machine slowed down between repetitions, so the
    sides' ranges overlap, but B took 5% less time in every pair: B is faster."""
    a = [10.0, 13.0, 9.0]
    b = [x * 0.95 for x in a]
    v = runs_verdict(a, b, what="total time", a_label="sync", b_label="async", unit=" s",
                     higher_is_better=False)
    assert v.measurable and v.change is not None
    assert v.change.estimate == pytest.approx(-5.0)
    assert "async is 5.0% faster than sync" in v.text
    assert "t-interval over 3 alternated pairs" in v.text


def test_a_rate_and_a_time_read_the_same_way_round() -> None:
    rate = runs_verdict([100, 104, 98], [120, 125, 118], what="tokens/s", a_label="a",
                        b_label="b")
    time = runs_verdict([1.0, 0.96, 1.02], [0.83, 0.8, 0.85], what="total time",
                        a_label="a", b_label="b", higher_is_better=False)
    assert "b is" in rate.text and "faster than a" in rate.text
    assert "b is" in time.text and "faster than a" in time.text
    neutral = runs_verdict([1.0, 0.96, 1.02], [0.83, 0.8, 0.85], what="x", a_label="a",
                           b_label="b", higher_is_better=None)
    assert "lower than a" in neutral.text


def test_a_large_difference_in_noisy_pairs_is_not_called_no_difference() -> None:
    # +35% by the medians, but the pairs disagree: the data cannot tell, and says so.
    v = runs_verdict([100, 104, 160], [141, 150, 98], what="steps/s", a_label="sync",
                     b_label="async")
    assert not v.measurable
    assert "no measurable difference" not in v.text and "not settled" in v.text


def test_close_pairs_are_no_measurable_difference() -> None:
    v = runs_verdict([10.0, 12.0, 11.0], [10.05, 11.98, 11.02], what="steps/s",
                     a_label="sync", b_label="async")
    assert not v.measurable and "no measurable difference" in v.text


def test_fewer_than_three_pairs_is_said_not_judged() -> None:
    v = runs_verdict([2.0, 2.1], [1.0, 1.1], what="total time", a_label="a", b_label="b",
                     higher_is_better=False)
    assert not v.measurable and v.change is None
    assert "2 alternated pairs of runs, at least 3 needed" in v.text
    assert judge(None, what="t", a_label="a", b_label="b").measurable is False


def test_spread_needs_a_value() -> None:
    with pytest.raises(ValueError, match="at least one"):
        spread([])


def test_the_benchmark_page_and_the_ab_page_use_the_same_statistics() -> None:
    """Alternated runs of decode steps: the A/B page's throughput interval is the one the
    Benchmark page's rule gives on the runs' decode tokens/s, and `python -m bench ab` gives
    the same interval for that figure."""
    a_runs = [run(noisy(30, 3.0 * d, 0.03, 10 + i), first=100 * i)
              for i, d in enumerate((1.0, 1.3, 0.9))]
    b_runs = [run(noisy(30, 2.5 * d, 0.03, 20 + i), first=100 * i + 50)
              for i, d in enumerate((1.0, 1.3, 0.9))]
    a, b = [decode_steps(r) for r in a_runs], [decode_steps(r) for r in b_runs]
    ab_page = compare_runs(a, b)
    assert ab_page is not None
    rates_a, rates_b = [r.tokens_per_s for r in a], [r.tokens_per_s for r in b]
    bench_page = runs_verdict(rates_a, rates_b, what="decode tokens/s", a_label="sync",
                              b_label="async")
    assert bench_page.change == ab_page[0] == paired_change(rates_a, rates_b)
    rows = compare([{"tok_s": x} for x in rates_a], [{"tok_s": x} for x in rates_b])
    assert [r.key for r in rows] == ["tok_s"] and rows[0].change == ab_page[0]
    assert bench_page.measurable and rows[0].verdict.measurable


def test_covered_counts_partial_overlaps() -> None:
    starts, ends = np.array([0, 10]), np.array([5, 20])
    got = covered(starts, ends, np.array([3, 0, 21]), np.array([12, 30, 25]))
    assert list(got) == [4, 15, 0]
