"""The history strip agrees with the gauges (issue 25, defect 5): a step in flight is not
idle, a long step is busy for its whole length, and the counts are the engine's now."""

from __future__ import annotations

import numpy as np
import pytest

from telemetry.records import Span, StepRecord
from ui.history import LiveHistory, bin_steps, history_figure, series_from_buckets

S = 1_000_000_000


def step(n: int, start: int, end: int, running: int = 8) -> StepRecord:
    return StepRecord(step=n, mode="sync", slot=0, num_requests=running,  # type: ignore[arg-type]
                      prefill_tokens=0, decode_tokens=running, running=running, waiting=0,
                      spans=[Span("cpu.prepare", start, start + 1000),
                             Span("compute", start + 1000, end)])


def steady(t0: int, seconds: int, per_s: int = 10) -> list[StepRecord]:
    dt = S // per_s
    return [step(k, t0 + k * dt, t0 + (k + 1) * dt - 1) for k in range(seconds * per_s)]


class Reader:
    def __init__(self, bus: FakeBus) -> None:
        self.bus, self.seen = bus, 0

    def steps(self) -> list[StepRecord]:
        out, self.seen = self.bus.steps[self.seen:], len(self.bus.steps)
        return out


class FakeBus:
    def __init__(self) -> None:
        self.steps: list[StepRecord] = []

    def reader(self, from_now: bool = False) -> Reader:
        return Reader(self)


def titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_a_step_in_flight_reads_as_running_not_as_idle() -> None:
    bus = FakeBus()
    bus.steps = steady(0, 10)  # 10 s of steps, 80 tok/s, busy ~100%
    hist = LiveHistory()
    now = 16 * S + 1  # then a step has been running for 6 s, not yet published
    hist.update(bus, None, now)
    s = hist.series(now, seconds=15, stats={"running": 8, "waiting": 3, "unfinished": 11})
    assert np.isnan(s.tokens_per_s[-5:]).all() and np.isnan(s.step_busy_pct[-5:]).all()
    assert s.running[-1] == 8 and s.waiting[-1] == 3  # the engine's counts, as the gauges
    fig_titles = " | ".join(titles(history_figure(s)))
    assert "<b>0 tok/s" not in fig_titles and "<b>0.0 %" not in fig_titles, fig_titles
    assert "tokens/s: <b>80 tok/s</b>" in fig_titles
    assert "step running 6 s" in fig_titles
    assert "8 / 3" in fig_titles


def test_an_idle_engine_still_reads_idle() -> None:
    bus = FakeBus()
    bus.steps = steady(0, 10)
    hist = LiveHistory()
    now = 16 * S + 1
    hist.update(bus, None, now)
    s = hist.series(now, seconds=15, stats={"running": 0, "waiting": 0, "unfinished": 0})
    assert (s.tokens_per_s[-5:] == 0).all() and (s.step_busy_pct[-5:] == 0).all()
    assert s.step_running_s is None
    assert "step running" not in " ".join(titles(history_figure(s)))


def test_a_long_step_is_busy_for_each_second_it_ran() -> None:
    # one 5 s step: its compute time spreads over the five buckets it covered
    buckets = bin_steps([step(0, 2 * S, 7 * S - 1)])
    s = series_from_buckets(buckets, now_ns=8 * S + 1, seconds=7)
    assert s.step_busy_pct[-6:-1] == pytest.approx([100.0] * 5, abs=0.01)
    assert s.tokens_per_s[-2] == 8  # its tokens arrive when it ends

