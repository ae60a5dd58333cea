"""The pure parts of the monitoring dashboard: window figures, history buckets,
recordings, alternated benchmark modes, widget validation, the engine-status adapter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.process.supervision import Kept
from telemetry.export import to_jsonl
from telemetry.records import RequestEvent, Span, StepRecord
from ui.engine_link import HUNG_AFTER_S, HangMemo, Watchdog, engine_status
from ui.figures.gauges import gauge_values
from ui.figures.history import bin_steps, history_figure, series_from_buckets, smooth
from ui.figures.recordings import RECORDINGS_DIR, load_recording, meta_line, parse_recording
from ui.figures.window_stats import window_stats
from ui.widgets.bench_runner import alternated, base_label
from ui.widgets.controls import load_lengths_error, load_stats_line
from ui.widgets.conversation import parse_seed, reply_tokens, sampling_error

MS = 1_000_000


def step(n: int, t0: int, cpu_ms: float, gpu_ms: float, mode: str = "sync") -> StepRecord:
    """A step whose CPU prep runs cpu_ms, then compute gpu_ms (sync: one after the other)."""
    prep_end = t0 + int(cpu_ms * MS)
    return StepRecord(step=n, mode=mode, slot=0, num_requests=1,  # type: ignore[arg-type]
                      prefill_tokens=0, decode_tokens=4, spans=[
                          Span("cpu.prepare", t0, prep_end),
                          Span("compute", prep_end, prep_end + int(gpu_ms * MS))])


def serial(n: int, cpu_ms: float, gpu_ms: float, mode: str = "sync") -> list[StepRecord]:
    period = int((cpu_ms + gpu_ms) * MS)
    return [step(i, i * period, cpu_ms, gpu_ms, mode) for i in range(n)]


# -------------------------------------------------------------------------- window figures
def test_window_stats_measure_step_period_and_the_cpus_share() -> None:
    s = window_stats(serial(50, cpu_ms=1.0, gpu_ms=3.0), "sync")
    assert s.step_ms == pytest.approx(4.0)
    assert s.cpu_ms == pytest.approx(1.0) and s.compute_ms == pytest.approx(3.0)
    assert s.cpu_share == pytest.approx(0.25)
    assert s.steps_per_s == pytest.approx(250, rel=0.02)
    assert s.busy == pytest.approx(0.75, abs=0.01)
    # In sync every gap of the compute lane is the CPU preparing the next step.
    assert s.idle_by_cause_ms["cpu"] == pytest.approx(50.0, rel=0.01)
    assert s.idle_by_cause_ms["no_work"] == pytest.approx(0.0)
    assert len(s.sub_steps_per_s) == 5


def test_idle_with_nothing_queued_is_no_work() -> None:
    recs = [StepRecord(step=0, mode="sync", slot=0, num_requests=1, prefill_tokens=0,
                       decode_tokens=1, spans=[Span("compute", 0, MS)])]
    assert window_stats(recs, "a", 0, 3 * MS).idle_by_cause_ms["no_work"] == pytest.approx(2.0)


def async_steps() -> list[StepRecord]:
    """Two async steps on two slots: step 0's D2H and post run while the GPU idles, but
    step 1 waits only for its own CPU work, which starts after them."""
    def rec(n: int, slot: int, spans: list[Span]) -> StepRecord:
        return StepRecord(step=n, mode="async", slot=slot, num_requests=1,  # type: ignore
                          prefill_tokens=0, decode_tokens=1, spans=spans)

    return [rec(0, 0, [Span("cpu.prepare", 0, MS), Span("compute", MS, 10 * MS),
                       Span("d2h", 10 * MS, 13 * MS), Span("cpu.post", 13 * MS, 14 * MS)]),
            rec(1, 1, [Span("cpu.prepare", 14 * MS, 16 * MS), Span("compute", 16 * MS, 20 * MS)])]


@pytest.mark.parametrize("recs", [serial(20, cpu_ms=1.0, gpu_ms=3.0), async_steps()],
                         ids=["sync", "async"])
def test_the_ab_page_blames_each_gap_as_the_live_page_does(recs) -> None:
    """The A/B page's idle by cause (window_stats) and the Live page's (gauge_values) are
    one attribution: for the same steps they give every cause the same time."""
    lo, hi = 0, max(s.end_ns for r in recs for s in r.spans)
    ab = window_stats(recs, "a", lo, hi).idle_by_cause_ms
    live = gauge_values(recs, (lo, hi)).idle_by_cause_ms
    assert ab == pytest.approx(live)
    if recs[0].mode == "async":
        # Step 0's copy-out is nobody's wait in async: the gap is nothing queued until
        # step 1's CPU work starts, then that CPU work (and step 0's before its compute).
        assert ab["no_work"] == pytest.approx(4.0) and ab["cpu"] == pytest.approx(1.0 + 2.0)


def test_an_empty_window_is_an_error() -> None:
    with pytest.raises(ValueError, match="no steps"):
        window_stats([], "a")


# ------------------------------------------------------------------------------- history
def test_history_bins_tokens_and_busy_per_second_and_leaves_out_the_filling_bucket() -> None:
    recs = serial(500, cpu_ms=1.0, gpu_ms=3.0)  # 2 s of steps, 4 tokens each
    buckets = bin_steps(recs)
    s = series_from_buckets(buckets, now_ns=2 * 10**9 + 1, seconds=5)
    assert s.tokens_per_s[-2:] == pytest.approx([1000.0, 1000.0], rel=0.01)
    assert s.step_busy_pct[-1] == pytest.approx(75.0, abs=1.0)
    assert s.tokens_per_s[0] == 0.0  # no steps then


def test_smoothing_ignores_gaps_and_keeps_the_level() -> None:
    out = smooth(np.array([np.nan, 3.0, 3.0, 9.0]))
    assert np.isnan(out[0]) and out[1] == 3.0 and out[3] == pytest.approx(5.0)


def test_history_scale_is_a_stable_ceiling_and_titles_carry_units() -> None:
    s = series_from_buckets(bin_steps(serial(500, 1.0, 3.0)), now_ns=2 * 10**9 + 1)
    fig = history_figure(s)
    assert tuple(fig.layout.yaxis.range) == (0, 1000)  # tokens/s max ~1000: 1-2-5 ceiling
    assert tuple(fig.layout.yaxis2.range) == (0, 100)  # a percentage
    titles = [a.text for a in fig.layout.annotations]
    assert titles[0].startswith("tokens/s") and "tok/s" in titles[0]


# ----------------------------------------------------------------------------- recordings
def test_a_recording_round_trips_through_the_exporter() -> None:
    recs = serial(3, 1.0, 2.0, "sync") + [step(9, 100 * MS, 1.0, 2.0, "async")]
    events = [RequestEvent("r0", "tokens", 5, num_tokens=1)]
    text = meta_line(machine="H200", date="2026-12-02", commit="abc1234",
                     workload="1 x (4 + 4)") + to_jsonl(recs + events)
    rec = parse_recording(text.splitlines(), name="x")
    assert rec.steps == recs and rec.events == events
    assert rec.modes() == ["sync", "async"]
    assert rec.title() == "H200 · 2026-12-02 · 1 x (4 + 4) · commit abc1234"


def test_a_bad_line_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="line 2: not JSON"):
        parse_recording(['{"type": "meta"}', "{oops"], name="bad")
    with pytest.raises(ValueError, match="unknown type 'span'"):
        parse_recording([json.dumps({"type": "span"})], name="bad")
    with pytest.raises(ValueError, match="no step records"):
        parse_recording([meta_line(machine="x")], name="empty")


def test_the_shipped_recording_has_labelled_sync_and_async_windows() -> None:
    rec = load_recording(RECORDINGS_DIR / "cpu-tiny.jsonl")
    for key in ("machine", "date", "commit", "workload"):
        assert rec.meta.get(key), key
    windows = rec.by_mode()
    assert list(windows) == ["sync", "async"]
    assert all(r.mode == "sync" for r in windows["sync"])
    assert all(r.mode == "async" for r in windows["async"])


# ------------------------------------------------------------------------------ benchmark
def test_modes_are_alternated_over_the_repetitions() -> None:
    modes = [{"async_batching": False}, {"async_batching": True}]
    labels = [m["label"] for m in alternated(modes, 3)]
    assert labels == ["sync #1", "async #1", "sync #2", "async #2", "sync #3", "async #3"]
    assert base_label("async+graphs #12") == "async+graphs"
    with pytest.raises(ValueError, match="repetitions must be an integer >= 1"):
        alternated(modes, 0)


# ------------------------------------------------------------------------------- widgets
@pytest.mark.parametrize(
    ("params", "error"),
    [({"top_k": 0}, "top_k must be -1 (off) or an integer in [1, 2147483647]"),
     ({"top_k": -1}, None), ({"top_k": 5}, None),
     ({"top_p": 0.0}, "top_p must be in (0, 1]"),
     ({"seed": -5}, "seed must be None or an integer in [0, 2147483647]"),
     ({"max_tokens": 0}, "max_tokens must be an integer in [1, 2147483647]")],
)
def test_sampling_widgets_use_the_engines_own_rules(params: dict, error: str | None) -> None:
    got = sampling_error(params)
    assert (got is None) if error is None else (got is not None and error in got)


def test_seed_text_is_a_whole_number_at_least_zero() -> None:
    assert parse_seed("") == (None, None)
    assert parse_seed(" 7 ") == (7, None)
    assert parse_seed("-5")[1] is not None and parse_seed("x")[1] is not None


def test_load_lengths_must_fit_max_model_len_as_the_engine_checks() -> None:
    assert load_lengths_error(64, 64, 128) is None
    assert "129 tokens exceeds the engine's max_model_len of 128" in str(
        load_lengths_error(65, 64, 128))
    assert "dropped arrivals 3" in load_stats_line({"dropped": 3, "submitted": 9})


def test_a_reply_cut_short_keeps_the_tokens_telemetry_saw() -> None:
    events = [RequestEvent("r1", "first_token", 1, num_tokens=1)] + [
        RequestEvent("r1", "tokens", t, num_tokens=1) for t in range(2, 12)
    ] + [RequestEvent("r2", "tokens", 3, num_tokens=1)]
    assert reply_tokens([], events, "r1") == 11  # the dead engine's result says 0
    assert reply_tokens([1, 2, 3], [], "r1") == 3


# --------------------------------------------------------------------------- engine status
class _Client:
    def __init__(self, alive: bool = True, status: str | None = None) -> None:
        self._alive = alive
        if status is not None:
            self.status = lambda: status

    def alive(self) -> bool:
        return self._alive

    def death_reason(self) -> str | None:
        return None if self._alive else "engine process exited with code -9 (SIGKILL)"


def test_status_uses_the_heartbeat_when_the_client_has_one() -> None:
    assert engine_status(_Client(status="not_responding")).state == "not_responding"
    dead = engine_status(_Client(alive=False, status="dead"))
    assert dead.state == "dead" and "SIGKILL" in str(dead.reason)
    assert engine_status(_Client(status="alive")).state == "alive"


def test_status_falls_back_to_alive_without_a_heartbeat() -> None:
    assert engine_status(_Client()).state == "alive"
    assert engine_status(_Client(alive=False)).state == "dead"


def test_remembered_settings_leave_graphs_out_where_unavailable() -> None:
    r = Kept()
    r.remember({"async_batching": False, "num_slots": 3, "cuda_graphs": False,
                "cuda_graphs_available": False, "device": "cpu"})
    assert r.live() == {"async_batching": False, "num_slots": 3}


def test_a_timed_out_call_marks_the_engine_hung_until_one_answers() -> None:
    now = [100.0]
    memo = HangMemo(clock=lambda: now[0])
    assert memo.hung_for() is None
    memo.timed_out()
    now[0] += 1.5
    memo.timed_out()  # a second timeout keeps the first one's time
    assert memo.hung_for() == pytest.approx(1.5)
    memo.answered()
    assert memo.hung_for() is None


def test_the_watchdog_calls_an_engine_hung_once_its_probe_waits_too_long() -> None:
    import threading

    now = [0.0]
    release = threading.Event()
    asked = threading.Event()

    class Stopped:
        def alive(self) -> bool:
            return True

        def settings(self) -> dict:
            asked.set()
            release.wait(5)  # a SIGSTOPped engine: no answer
            return {}

    memo = HangMemo(clock=lambda: now[0])
    dog = Watchdog(Stopped(), memo, clock=lambda: now[0]).start()
    try:
        assert asked.wait(5)
        assert not dog.overdue()
        now[0] += HUNG_AFTER_S + 0.1
        assert dog.overdue()  # reported before any call times out
    finally:
        dog.stop()
        release.set()
