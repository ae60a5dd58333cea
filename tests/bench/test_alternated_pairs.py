"""Alternated pairs in bench suites: B against A with the dashboard's 95% interval
(telemetry.verdict), so a suite's A/B figure and the Benchmark page's verdict agree."""

from __future__ import annotations

import pytest

from bench.harness.timing import alternated_pairs
from telemetry.verdict import runs_verdict


def test_alternated_pairs_give_the_dashboards_interval():
    a_times = iter([1.0, 1.3, 0.9])
    b_times = iter([0.9, 1.17, 0.81])  # 10% less in every pair, whatever the drift
    pairs = alternated_pairs(lambda: next(a_times), lambda: next(b_times), 3)
    change = pairs.change
    assert change is not None and change.estimate == pytest.approx(-10.0)
    assert not change.holds_zero()
    page = runs_verdict(pairs.a.values, pairs.b.values, what="t", a_label="a", b_label="b",
                        higher_is_better=False)
    assert page.change == change and page.kind == "faster"
    assert pairs.summary()["change_pct"]["estimate"] == pytest.approx(-10.0)


def test_two_pairs_have_no_interval():
    pairs = alternated_pairs(lambda: 1.0, lambda: 0.9, 2)
    assert pairs.change is None and pairs.summary()["change_pct"] is None
