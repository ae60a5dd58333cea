"""Idle by cause on hand-made step sequences shaped like sync and async runs."""

from __future__ import annotations

import pytest

from telemetry.gaps import CAUSES, idle_by_cause
from telemetry.metrics import busy_fraction, spans_of
from telemetry.records import Span, StepRecord

US = 1_000


def step(n: int, **lanes: tuple[int, int]) -> StepRecord:
    """A step with spans given in microseconds, lane names with '_' for '.'."""
    spans = [Span(k.replace("_", "."), a * US, b * US) for k, (a, b) in lanes.items()]
    return StepRecord(step=n, mode="sync", slot=0, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, spans=spans)


def sync_steps(period: int = 100, first: int = 0, count: int = 3) -> list[StepRecord]:
    """Sync graph steps: CPU 0-20 (schedule 0-5, prepare 5-15, launch 15-20), h2d 20-24,
    graph launch 24-30, compute 30-80, d2h 80-84, wait 20-86, post 86-100."""
    out = []
    for k in range(first, first + count):
        t = k * period
        out.append(step(k, cpu_schedule=(t, t + 5), cpu_prepare=(t + 5, t + 15),
                        cpu_launch=(t + 15, t + 20), h2d=(t + 20, t + 24),
                        compute_launch=(t + 24, t + 30), compute=(t + 30, t + 80),
                        d2h=(t + 80, t + 84), cpu_wait=(t + 20, t + 86),
                        cpu_post=(t + 86, t + 100)))
    return out


def test_sync_gaps_are_split_into_their_causes() -> None:
    recs = sync_steps()
    # Window from step 0's compute end to step 2's compute start: two full gaps.
    b = idle_by_cause(recs, 80 * US, 230 * US)
    assert [(g.start_ns // US, g.end_ns // US, g.step) for g in b.gaps] == [
        (80, 130, 1), (180, 230, 2)]
    per_gap = {"previous_step": 20, "cpu": 20, "h2d": 4, "graph_launch": 6}
    assert b.gaps[0].causes == {k: v * US for k, v in per_gap.items()}
    assert b.gaps[0].cause in ("previous_step", "cpu")
    assert b.by_cause == {"cpu": 40 * US, "graph_launch": 12 * US, "h2d": 8 * US,
                          "previous_step": 40 * US, "no_work": 0}
    busy = busy_fraction(spans_of(recs), 80 * US, 230 * US)
    assert b.idle_ns == pytest.approx((1 - busy) * 150 * US)
    assert sum(b.by_cause.values()) == b.idle_ns
    assert b.share("cpu") == pytest.approx(40 / 150)


def test_async_gap_is_the_cpu_being_late_and_an_idle_engine_is_no_work() -> None:
    # Step 1's CPU work (prepare) overruns step 0's compute by 10 us; after step 1 the
    # engine has nothing to do for 500 us.
    s0 = step(0, cpu_prepare=(0, 10), cpu_launch=(10, 12), h2d=(12, 14), compute=(14, 50))
    s1 = step(1, cpu_schedule=(20, 25), cpu_prepare=(25, 58), cpu_launch=(58, 60),
              h2d=(60, 61), compute=(61, 100))
    s0.spans += [Span("d2h", 50 * US, 52 * US), Span("cpu.post", 62 * US, 70 * US)]
    b = idle_by_cause([s1, s0], -100 * US, 600 * US)  # any order
    gaps = {g.start_ns // US: g for g in b.gaps}
    # Before step 0's CPU work nothing was queued; then its own CPU work and copy.
    assert gaps[-100].causes == {"no_work": 100 * US, "cpu": 12 * US, "h2d": 2 * US}
    # 50-61: d2h of step 0 overlaps step 1's prepare: the step's own CPU work wins.
    assert gaps[50].causes == {"cpu": 10 * US, "h2d": 1 * US} and gaps[50].step == 1
    assert gaps[100].causes == {"no_work": 500 * US} and gaps[100].step is None
    assert b.largest().start_ns == 100 * US
    assert set(b.by_cause) == set(CAUSES)


def test_async_gap_is_never_blamed_on_the_d2h_nothing_waits_for() -> None:
    """Async, two slots: before scheduling step 2 the CPU posts step 0 (the loop reads step N
    after launching N+1); step 1's D2H runs in the gap but nothing waits for it."""
    def astep(n: int, **lanes: tuple[int, int]) -> StepRecord:
        rec = step(n, **lanes)
        rec.mode, rec.slot = "async", n % 2
        return rec

    s0 = astep(0, compute=(0, 40), d2h=(40, 42), cpu_wait=(45, 46), cpu_post=(46, 70))
    s1 = astep(1, compute=(40, 50), d2h=(50, 60))
    s2 = astep(2, cpu_schedule=(70, 72), cpu_prepare=(72, 78), cpu_launch=(78, 80),
               h2d=(80, 81), compute=(81, 120))
    gap = idle_by_cause([s0, s1, s2], 0, 120 * US).gaps[0]
    assert (gap.start_ns, gap.end_ns, gap.step) == (50 * US, 81 * US, 2)
    assert gap.causes == {"previous_step": 20 * US, "cpu": 10 * US, "h2d": 1 * US}
    # With one slot the loop reads step 1 before reusing its slot: step 1's tail counts.
    for r in (s0, s1, s2):
        r.slot = 0
    s1.spans += [Span("cpu.wait", 55 * US, 61 * US), Span("cpu.post", 61 * US, 70 * US)]
    gap = idle_by_cause([s0, s1, s2], 0, 120 * US).gaps[0]
    assert gap.causes == {"previous_step": 20 * US, "cpu": 10 * US, "h2d": 1 * US}
    assert gap.cause == "previous_step"


def test_busy_window_has_no_gaps_and_bad_window_is_refused() -> None:
    recs = sync_steps()
    b = idle_by_cause(recs, 35 * US, 75 * US)
    assert b.idle_ns == 0 and b.gaps == []
    assert idle_by_cause(recs, 5, 5).idle_ns == 0
    with pytest.raises(ValueError, match="before its start"):
        idle_by_cause(recs, 10, 5)
