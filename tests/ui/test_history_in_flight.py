"""The history strip agrees with the gauges: a step in flight is busy in both, both read one
window, a long step is busy for its whole length, the running and waiting lines have no gap
while it runs, and the counts are the engine's now.

Before, during a long step the strip's step busy read 81 then 43% (its in-flight seconds
left out) while the gauges, ending their window at the last published step, stayed at
99.7%; and the running-requests line broke off for every second no step ended in.
"""

from __future__ import annotations

import base64
import time

import numpy as np
import pytest
from fake_engine import FakeEngineClient
from test_pages_fake import app, live_figures

from telemetry.bus import TelemetryBus
from telemetry.records import Span, StepRecord
from ui.figures.history import LiveHistory, bin_steps, history_figure, series_from_buckets

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


def values(y: object) -> np.ndarray:
    """A trace's values as the browser gets them (a list, or Plotly's base64 typed array)."""
    if isinstance(y, dict):
        return np.frombuffer(base64.b64decode(y["bdata"]), dtype=y["dtype"]).astype(float)
    return np.asarray(y, dtype=float)


def titles(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_a_step_in_flight_reads_as_running_and_busy_not_as_idle() -> None:
    bus = FakeBus()
    bus.steps = steady(0, 10)  # 10 s of steps, 80 tok/s, busy ~100%
    hist = LiveHistory()
    now = 16 * S + 1  # then a step has been running for 6 s, not yet published
    hist.update(bus, None, now)
    s = hist.series(now, seconds=15, stats={"running": 8, "waiting": 3, "unfinished": 11})
    assert np.isnan(s.tokens_per_s[-5:]).all()  # its tokens count when it ends
    assert s.step_busy_pct[-5:] == pytest.approx([100.0] * 5)
    assert (s.running[-6:] == 8).all() and (s.waiting[-6:] == 3).all()  # no gap
    fig_titles = " | ".join(titles(history_figure(s)))
    assert "<b>0 tok/s" not in fig_titles and "<b>0.0 %" not in fig_titles, fig_titles
    assert "tokens/s: <b>80 tok/s</b>" in fig_titles
    assert "step running 6 s" in fig_titles
    assert "8 / 3" in fig_titles


def test_a_published_long_step_holds_its_counts_in_the_seconds_it_ran() -> None:
    s = series_from_buckets(bin_steps([step(0, 2 * S, 7 * S - 1, running=5)]),
                            now_ns=8 * S + 1, seconds=7)
    assert list(s.running[-6:-1]) == [5.0] * 5  # no gap in the running line
    assert s.running[-1] == 0  # then nothing runs


def test_the_strip_and_the_gauges_read_one_window_during_a_long_step(
        fake: FakeEngineClient) -> None:
    """Three seconds of back-to-back steps, then a step launched 3.5 s or more ago still
    running (the engine has requests running): the strip's step busy and the step busy
    gauge both say 100%, and the running line reaches now without a gap."""
    now = time.perf_counter_ns()
    end = (now // S - 4) * S + S // 2  # the last published step ended mid-second
    fake.bus = TelemetryBus()
    for k in range(300):
        fake.bus.publish_step(step(k, end - 3 * S + k * S // 100,
                                   end - 3 * S + (k + 1) * S // 100, running=2))
    at = app().run()
    assert not at.exception
    figs = live_figures(at)
    (busy_title,) = [a["text"] for a in figs["live.history"]["layout"]["annotations"]
                     if a["text"].startswith("step busy")]
    assert "<b>100 %</b>" in busy_title, busy_title
    (gauge,) = [d for d in figs["live.gauges"]["data"] if d.get("name") == "step busy"]
    assert gauge["value"] == pytest.approx(100.0)
    (running,) = [t for t in figs["live.history"]["data"] if t["name"] == "running"]
    y = values(running["y"])
    assert not np.isnan(y[-6:]).any(), y[-6:]


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

