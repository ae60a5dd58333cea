"""The Live timeline marks each stalled step (telemetry/stalls.py's verdict on its record) at
its end, its interval drawn back to the step before it and its cause on hover."""

from __future__ import annotations

from telemetry.records import Span, StepRecord
from ui.figures.timeline import timeline_figure

MS = 1_000_000


def step(n: int, stall: str = "", stall_ms: int = 0) -> StepRecord:
    t = n * 10 * MS
    return StepRecord(step=n, mode="async", slot=n % 2, num_requests=4, prefill_tokens=0,
                      decode_tokens=4, spans=[Span("cpu.post", t, t + 9 * MS)], stall=stall,
                      stall_ns=stall_ms * MS, stall_baseline_ns=10 * MS if stall else 0,
                      stall_detail="generation 2 GC (80.0 ms); cpu.post +80.0 ms" if stall
                      else "")


def test_a_stalled_step_is_marked_with_its_cause_on_hover():
    records = [step(n) for n in range(5)] + [step(5, "gc", 90)] + [step(n) for n in (6, 7)]
    fig = timeline_figure(records)
    (marks,) = [t for t in fig.data if t.name.startswith("stall")]
    assert len(marks.x) == 1
    assert marks.x[0] == -20.0  # step 5 ends 20 ms before the newest span (step 7's end)
    assert list(marks.error_x.arrayminus) == [90.0]  # its interval, back to the step before
    text = marks.hovertext[0]
    assert "stall: gc" in text and "90.0 ms" in text and "usually 10.0 ms" in text
    assert "generation 2 GC" in text and "step 5" in text


def test_no_stall_no_mark():
    fig = timeline_figure([step(n) for n in range(5)])
    assert not any(t.name.startswith("stall") for t in fig.data)
