"""The stall detector (telemetry/stalls.py) on made-up steps: what counts as a stall, and each
cause named from the facts the engine hands it; records without the stall fields still load."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.process.wire import decode_steps, encode_steps
from telemetry.records import Span, StepRecord
from telemetry.stalls import (
    CPU_DESCHEDULED,
    ENGINE_COMMAND,
    GC,
    GRAPH_CAPTURE,
    HOST_WAIT,
    MIN_STEPS,
    PREEMPTION,
    PREFILL_CHUNK,
    SENTINEL_CHECK,
    STALL_CAUSE_NAMES,
    UNEXPLAINED,
    Mark,
    StallDetector,
    StepFacts,
)
from ui.figures.recordings import load_recording

MS = 1_000_000
RECORDINGS = Path(__file__).resolve().parents[2] / "docs" / "recordings"


class Steps:
    """Sync steps one after another, each laid out as schedule / prepare / launch / wait /
    post; ``lanes`` gives a lane's length in ms (the rest keep their usual length)."""

    USUAL = {"cpu.schedule": 1, "cpu.prepare": 1, "cpu.launch": 1, "cpu.wait": 6, "cpu.post": 1}

    def __init__(self) -> None:
        self.t = 1_000 * MS
        self.n = 0
        self.det = StallDetector()

    def record(self, *, prefill: int = 0, requests: int = 8, preemptions: int = 0,
               recomputed: int = 0, lanes: dict[str, float] | None = None,
               gap_ms: float = 0) -> StepRecord:
        self.t += int(gap_ms * MS)
        spans, t = [], self.t
        for lane, ms in {**self.USUAL, **(lanes or {})}.items():
            spans.append(Span(lane, t, t + int(ms * MS)))
            t += int(ms * MS)
        wait = next(sp for sp in spans if sp.lane == "cpu.wait")
        spans.append(Span("compute", wait.start_ns, wait.end_ns - MS // 10))  # what it waits for
        self.t = t
        rec = StepRecord(step=self.n, mode="sync", slot=0, num_requests=requests,
                         prefill_tokens=prefill, decode_tokens=requests, spans=spans,
                         running=requests, preemptions=preemptions,
                         recomputed_tokens=recomputed)
        self.n += 1
        return rec

    def run(self, n: int, facts: dict | None = None, **kw) -> list[StepRecord]:
        """n usual steps, each with the thread facts of a step that ran as usual."""
        out = []
        for _ in range(n):
            rec = self.record(**kw)
            self.det.observe(rec, self.usual_facts(**(facts or {})))
            out.append(rec)
        return out

    @staticmethod
    def usual_facts(**kw) -> StepFacts:
        # 4 ms of CPU, 0.2 ms in the run queue; the rest is the 6 ms wait for the device.
        return StepFacts(**{"cpu_ns": 4 * MS, "runqueue_ns": MS // 5, **kw})

    def stalled(self, facts: StepFacts | None = None, **kw) -> StepRecord:
        rec = self.record(**kw)
        self.det.observe(rec, facts or self.usual_facts())
        return rec


@pytest.fixture
def steps() -> Steps:
    s = Steps()
    s.run(20)
    return s


def test_usual_steps_and_a_twice_as_slow_one_are_no_stalls(steps):
    assert not any(r.stall for r in steps.run(30))
    rec = steps.stalled(lanes={"cpu.post": 11})  # 20 ms against 10: slower, not a stall
    assert rec.stall == "" and steps.det.stalls == 0


def test_a_kind_with_too_few_steps_judges_nothing():
    s = Steps()
    s.run(MIN_STEPS - 1)
    assert s.stalled(lanes={"cpu.post": 500}).stall == ""


def test_an_idle_engine_between_steps_is_no_stall(steps):
    last = steps.run(1)[0]
    last.running = 0  # the step before left nothing to run: the wait for work is not a stall
    steps.det.observe(last, steps.usual_facts())  # (observed again, now as an idle end)
    assert steps.stalled(gap_ms=2_000).stall == ""


def test_a_gc_pause_is_named_with_its_generation(steps):
    t = steps.t
    rec = steps.stalled(StepFacts(marks=[Mark(GC, t + 2 * MS, t + 92 * MS, "generation 2 GC")],
                                  cpu_ns=94 * MS, runqueue_ns=0), lanes={"cpu.prepare": 91})
    assert rec.stall == GC
    assert rec.stall_ns == 100 * MS and rec.stall_baseline_ns == 10 * MS
    assert "generation 2 GC" in rec.stall_detail and "cpu.prepare +90.0 ms" in rec.stall_detail


def test_a_graph_capture_inside_a_command_is_the_capture(steps):
    t = steps.t
    marks = [Mark(ENGINE_COMMAND, t, t + 100 * MS, "live settings: num_slots=3"),
             Mark(GRAPH_CAPTURE, t + 10 * MS, t + 90 * MS, "CUDA graphs captured for 3 slots")]
    rec = steps.stalled(Steps.usual_facts(marks=marks), gap_ms=100)
    assert rec.stall == GRAPH_CAPTURE
    assert "captured for 3 slots" in rec.stall_detail
    assert "between phases +100.0 ms" in rec.stall_detail


def test_an_engine_command_between_steps(steps):
    t = steps.t
    mark = Mark(ENGINE_COMMAND, t, t + 60 * MS, "live settings: num_slots=3")
    rec = steps.stalled(Steps.usual_facts(marks=[mark]), gap_ms=60)
    assert rec.stall == ENGINE_COMMAND and "num_slots=3" in rec.stall_detail


def test_a_sentinel_check_that_holds_the_compute_stream(steps):
    t = steps.t
    mark = Mark(SENTINEL_CHECK, t + 2 * MS, t + 62 * MS, "sentinel re-scored 300 tokens of r1")
    rec = steps.stalled(Steps.usual_facts(marks=[mark]), lanes={"cpu.wait": 66})
    assert rec.stall == SENTINEL_CHECK and "cpu.wait +60.0 ms" in rec.stall_detail


def test_a_mark_that_explains_too_little_names_nothing(steps):
    t = steps.t
    mark = Mark(GC, t, t + 5 * MS, "generation 0 GC")  # 5 ms of a 50 ms excess
    rec = steps.stalled(Steps.usual_facts(marks=[mark], cpu_ns=54 * MS),
                        lanes={"cpu.prepare": 51})
    assert rec.stall == UNEXPLAINED and rec.stall_detail.startswith("cpu.prepare +50.0 ms")


def test_a_thread_waiting_for_a_cpu_is_descheduled(steps):
    rec = steps.stalled(Steps.usual_facts(runqueue_ns=70 * MS), lanes={"cpu.post": 71})
    assert rec.stall == CPU_DESCHEDULED and "waited" in rec.stall_detail


def test_the_host_compute_threads_run_queue_counts_too(steps):
    rec = steps.stalled(Steps.usual_facts(worker_runqueue_ns=70 * MS), lanes={"cpu.wait": 76})
    assert rec.stall == CPU_DESCHEDULED


def test_a_blocked_host_path_is_a_host_wait(steps):
    # 300 ms off the CPU, not runnable, outside the wait for the device: a sleep, a lock, I/O.
    rec = steps.stalled(lanes={"cpu.post": 301})
    assert rec.stall == HOST_WAIT and "cpu.post +300.0 ms" in rec.stall_detail


def test_a_prefill_of_unusual_size(steps):
    steps.run(20, prefill=16, lanes={"cpu.wait": 10})
    rec = steps.stalled(Steps.usual_facts(cpu_ns=80 * MS), prefill=512,
                        lanes={"cpu.wait": 80})
    assert rec.stall == PREFILL_CHUNK and "512 prefill tokens (usually 16)" in rec.stall_detail


def test_a_big_prefill_on_a_busy_host_waits_longer_for_a_cpu_and_is_still_the_prefill(steps):
    """On a busy host a step with ten times the work also waits ten times as long in the run
    queue: that wait is the prefill's, not a descheduling."""
    busy = {"runqueue_ns": 4 * MS}  # as long in the run queue as on a CPU, each step
    steps.run(30, busy, prefill=16, lanes={"cpu.wait": 10})
    rec = steps.stalled(Steps.usual_facts(cpu_ns=40 * MS, runqueue_ns=40 * MS,
                                          worker_cpu_ns=160 * MS, worker_runqueue_ns=160 * MS),
                        prefill=512, lanes={"cpu.wait": 190})
    assert rec.stall == PREFILL_CHUNK, rec.stall_detail


def test_a_big_prefill_that_was_also_descheduled_is_named_for_the_prefill(steps):
    """Both the prefill and a long run-queue wait (several threads' waits add up past the
    wall time) account for the whole excess: the step's own fact names it."""
    steps.run(20, prefill=16, lanes={"cpu.wait": 10})
    rec = steps.stalled(Steps.usual_facts(runqueue_ns=100 * MS, worker_cpu_ns=40 * MS,
                                          worker_runqueue_ns=600 * MS),
                        prefill=512, lanes={"cpu.wait": 400})
    assert rec.stall == PREFILL_CHUNK, rec.stall_detail


def test_a_recompute_after_a_preemption(steps):
    steps.run(20, prefill=16, lanes={"cpu.wait": 10})
    rec = steps.stalled(Steps.usual_facts(cpu_ns=80 * MS), prefill=300, recomputed=300,
                        lanes={"cpu.wait": 80})
    assert rec.stall == PREEMPTION and "300 tokens recomputed" in rec.stall_detail


def test_unexplained_names_the_lane_that_grew(steps):
    rec = steps.stalled(Steps.usual_facts(cpu_ns=44 * MS), lanes={"cpu.schedule": 41})
    assert rec.stall == UNEXPLAINED and rec.stall_detail == "cpu.schedule +40.0 ms"


def test_a_slow_device_step_names_what_the_cpu_waited_for(steps):
    rec = steps.stalled(lanes={"cpu.wait": 56})  # the CPU blocked on the device, as usual
    assert rec.stall == UNEXPLAINED
    assert rec.stall_detail == "cpu.wait +50.0 ms (compute +50.0 ms)"


def test_unknown_thread_times_fall_through_to_the_lanes(steps):
    rec = steps.stalled(StepFacts(), lanes={"cpu.post": 301})
    assert rec.stall == UNEXPLAINED and rec.stall_detail.startswith("cpu.post")


def test_async_steps_count_the_next_steps_phases_in_their_interval():
    """In async mode the interval of step N holds step N+1's schedule, prepare and launch:
    a slow schedule shows in the step whose tokens it delayed."""
    det = StallDetector()
    t = 1_000 * MS

    def step(n: int, schedule_ms: float) -> tuple[StepRecord, StepRecord]:
        nonlocal t
        nxt = StepRecord(step=n + 1, mode="async", slot=0, num_requests=8, prefill_tokens=0,
                         decode_tokens=8, running=8)
        nxt.spans = [Span("cpu.schedule", t, t + int(schedule_ms * MS)),
                     Span("cpu.prepare", t + int(schedule_ms * MS),
                          t + int((schedule_ms + 1) * MS))]
        t += int((schedule_ms + 1) * MS)
        return nxt, t

    cur = StepRecord(step=0, mode="async", slot=0, num_requests=8, prefill_tokens=0,
                     decode_tokens=8, running=8, spans=[Span("cpu.schedule", t, t + MS)])
    t += MS
    flagged = []
    for n in range(40):
        nxt, t = step(n, 80 if n == 30 else 1)
        cur.spans += [Span("cpu.wait", t, t + 3 * MS), Span("cpu.post", t + 3 * MS, t + 4 * MS)]
        t += 4 * MS
        det.observe(cur, StepFacts(next_record=nxt, cpu_ns=3 * MS, runqueue_ns=0))
        if cur.stall:
            flagged.append(cur)
        cur = nxt
    assert [r.step for r in flagged] == [30]
    assert flagged[0].stall == HOST_WAIT and "cpu.schedule +79.0 ms" in flagged[0].stall_detail


def test_every_cause_is_a_label_once():
    assert len(set(STALL_CAUSE_NAMES)) == len(STALL_CAUSE_NAMES) == 9


def test_records_carry_the_verdict_across_the_wire_and_old_recordings_load(steps):
    rec = steps.stalled(lanes={"cpu.post": 301})
    (back,) = decode_steps(encode_steps([rec]))
    assert (back.stall, back.stall_ns, back.stall_detail) == (
        rec.stall, rec.stall_ns, rec.stall_detail)
    old = load_recording(RECORDINGS / "cpu-tiny.jsonl")  # made before steps had stall fields
    assert old.steps and all(r.stall == "" and r.recomputed_tokens == 0 for r in old.steps)
