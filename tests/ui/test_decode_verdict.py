"""The A/B and Recordings verdict (issue 25, defect 4): decode-only steps compared, prefill
apart, the difference given with a 95% interval that says where it comes from."""

from __future__ import annotations

import re

import numpy as np
import pytest

from telemetry.records import Span, StepRecord
from ui.decode_verdict import decode_steps, decode_verdict
from ui.recordings import RECORDINGS_DIR, load_recording

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
    # sub-window spread (the old verdict's "no measurable difference").
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


def test_the_shipped_h200_1b_recording_names_the_async_gain_with_its_interval() -> None:
    rec = load_recording(RECORDINGS_DIR / "h200-llama-1b.jsonl")
    windows = rec.by_mode()
    assert list(windows) == ["sync+graphs", "async+graphs"]
    v = decode_verdict([windows["sync+graphs"]], [windows["async+graphs"]],
                       a_label="sync+graphs", b_label="async+graphs")
    assert v.measurable and "no measurable difference" not in v.text
    m = re.search(r"async\+graphs is (\d+\.\d)% faster than sync\+graphs\*\* \(95% interval "
                  r"\+(\d+\.\d)% to \+(\d+\.\d)%", v.text)
    assert m, v.text
    gain, lo, hi = (float(x) for x in m.groups())
    assert 0 < lo < gain < hi
    # The same gain from the recording's own figures: decode tokens over the decode-only
    # steps' time, each side (independent of the bootstrap).
    a, b = decode_steps(windows["sync+graphs"]), decode_steps(windows["async+graphs"])
    assert gain == pytest.approx(100 * (b.tokens_per_s / a.tokens_per_s - 1), abs=0.06)
    assert lo > 20  # the recording's async gain is large: never "no difference"
    busy = re.search(r"sync\+graphs (\d+\.\d)%, async\+graphs (\d+\.\d)%", v.text)
    assert busy and float(busy.group(1)) < 80 < 99 < float(busy.group(2))
