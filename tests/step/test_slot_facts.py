"""What a step record says about its slot, on a real CPU engine (host-emulated streams): which
slot each step used, how long its inputs waited for the device and the CPU for a free slot,
and why the async pipeline read a step with nothing launched behind it (SyncFallback)."""

from __future__ import annotations

import json
import pickle

import pytest
from engine_checks import mixed_prompts
from test_async_pipeline import drive

from engine import Engine, EngineConfig, SamplingParams
from engine.process.wire import decode_steps, encode_steps, pickle_frame
from telemetry.export import chrome_trace_json, write_jsonl
from telemetry.records import Span, StepRecord, SyncFallback
from ui.figures.recordings import load_recording

GREEDY = dict(temperature=0.0, ignore_eos=True)
# Blocks to spare: no preemption, so a schedule is empty only once a burst's last step is out.
ROOMY = dict(device="cpu", max_num_seqs=5, max_num_batched_tokens=16, block_size=4,
             num_blocks=200, max_model_len=96)


def make_engine(model_dir, **kw) -> Engine:
    return Engine(EngineConfig(model=str(model_dir), **{**ROOMY, **kw}), start=False)


def run(eng: Engine, prompts: list[list[int]], max_tokens: int = 10,
        on_step=None) -> list[StepRecord]:
    reader = eng.bus.reader()
    hs = [eng.submit(p, SamplingParams(max_tokens=max_tokens, **GREEDY)) for p in prompts]
    drive(eng, on_step=on_step)
    assert all(h.result(1).finish_reason == "length" for h in hs)
    recs = sorted(reader.steps(), key=lambda r: r.step)
    assert recs and [r.step for r in recs] == list(range(recs[0].step, recs[-1].step + 1))
    return recs


def lane(rec: StepRecord, name: str):
    return next(s for s in rec.spans if s.lane == name)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts(6, seed=3)


def test_two_slots_alternate_and_only_the_burst_end_is_read_alone(model_dir, prompts):
    eng = make_engine(model_dir, async_batching=True, num_slots=2)
    try:
        recs = run(eng, prompts)
    finally:
        eng.shutdown()
    assert [r.slot for r in recs] == [r.step % 2 for r in recs]
    assert {r.slot for r in recs} == {0, 1}
    # Every step overlapped the next except the last of the burst, read when nothing was left.
    assert [r.sync_fallback for r in recs[:-1]] == [None] * (len(recs) - 1)
    assert recs[-1].sync_fallback is SyncFallback.NOTHING_SCHEDULED
    # With a second slot the CPU never waits for one.
    assert all(r.slot_wait_ns == 0 for r in recs)


def test_one_slot_async_reads_every_step_before_the_next_launch(model_dir, prompts):
    eng = make_engine(model_dir, async_batching=True, num_slots=1)
    eng.streams.h2d.delay_s = 0.003  # the next step's prep ends before the slot's copy does
    try:
        recs = run(eng, prompts)
    finally:
        eng.shutdown()
    assert all(r.mode == "async" and r.slot == 0 for r in recs)
    assert [r.sync_fallback for r in recs[:-1]] == [SyncFallback.SINGLE_SLOT] * (len(recs) - 1)
    assert recs[-1].sync_fallback is SyncFallback.NOTHING_SCHEDULED
    # The CPU waited for the slot's last copy: between scheduling and preparing the step.
    assert any(r.slot_wait_ns > 0 for r in recs[1:])
    for r in recs:
        gap = lane(r, "cpu.prepare").start_ns - lane(r, "cpu.schedule").end_ns
        assert 0 <= r.slot_wait_ns <= gap


def test_a_live_settings_change_drains_the_step_in_flight(model_dir, prompts):
    eng = make_engine(model_dir, async_batching=True, num_slots=2)
    in_flight: list[int] = []

    def on_step(n: int) -> None:
        if n == 6:
            in_flight.append(eng.loop.inflight.step)
            eng.configure(num_slots=3)  # manual stepping: applied at once, at this boundary

    try:
        recs = run(eng, prompts, on_step=on_step)
    finally:
        eng.shutdown()
    drained = [r.step for r in recs if r.sync_fallback is SyncFallback.LIVE_SETTINGS]
    assert drained == in_flight
    after = [r for r in recs if r.step > in_flight[0]]
    assert [r.slot for r in after] == [r.step % 3 for r in after]


def test_sync_mode_is_sync_not_a_fallback(model_dir, prompts):
    eng = make_engine(model_dir, async_batching=False, num_slots=1)
    try:
        recs = run(eng, prompts)
    finally:
        eng.shutdown()
    assert all(r.mode == "sync" and r.sync_fallback is None for r in recs)
    assert all(r.slot_wait_ns == 0 for r in recs)


def test_shutdown_reads_the_step_in_flight_as_a_shutdown(model_dir, prompts):
    eng = make_engine(model_dir, async_batching=True, num_slots=2)
    reader = eng.bus.reader()
    eng.submit(prompts[0], SamplingParams(max_tokens=50, **GREEDY))
    for _ in range(4):
        eng.step()
    last = eng.loop.inflight.step
    eng.shutdown()
    recs = {r.step: r for r in reader.steps()}
    assert recs[last].sync_fallback is SyncFallback.SHUTDOWN


@pytest.mark.parametrize("async_batching", [False, True])
def test_input_wait_is_inside_the_step_and_async_inputs_wait_for_the_device(
        model_dir, prompts, async_batching):
    """The inputs' wait runs from the H2D copy's end to the compute's start. In async mode the
    next step's inputs are on the device while the step before it still computes."""
    eng = make_engine(model_dir, async_batching=async_batching, num_slots=2)
    eng.streams.compute.delay_s = 0.004
    try:
        recs = run(eng, prompts)
    finally:
        eng.shutdown()
    for r in recs:
        wait = r.input_wait_ns
        assert wait is not None and wait >= 0
        assert lane(r, "h2d").end_ns + wait == lane(r, "compute").start_ns
        first = min(s.start_ns for s in r.spans)
        assert wait <= r.end_ns - first
    waited = [r for r in recs if r.input_wait_ns > 1_000_000]  # > 1 ms: behind a compute
    if async_batching:
        assert len(waited) >= len(recs) // 2, f"{len(waited)} of {len(recs)}"
    else:
        # Sync mode launches a step only after the last one's results were read: its inputs
        # wait only for the compute thread to wake (a loaded machine may delay a few).
        assert len(waited) <= len(recs) // 4, f"{len(waited)} of {len(recs)}"


def test_records_without_slot_facts_still_build():
    """Recordings and wire rows made before records carried slot facts: defaults."""
    rec = StepRecord(step=0, mode="async", slot=1, num_requests=1, prefill_tokens=0,
                     decode_tokens=1)
    assert rec.slot_wait_ns == 0 and rec.sync_fallback is None and rec.input_wait_ns is None


def test_the_trace_and_a_recording_carry_the_slot_facts(model_dir, prompts, tmp_path):
    """A one-slot async run exported: the Chrome trace marks each step read alone with its
    reason where the CPU read it, and the JSON lines read back as the same facts."""
    eng = make_engine(model_dir, async_batching=True, num_slots=1)
    try:
        recs = run(eng, prompts[:3])
    finally:
        eng.shutdown()
    trace = json.loads(chrome_trace_json(recs))
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "sync_fallback"]
    assert [m["args"]["step"] for m in marks] == [r.step for r in recs]
    assert {m["name"] for m in marks} == {"read alone: single slot",
                                          "read alone: nothing scheduled"}
    rows = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {rows[m["tid"]] for m in marks} == {"cpu.wait"}
    back = load_recording(write_jsonl(tmp_path / "slots.jsonl", recs)).steps
    assert [(r.slot, r.slot_wait_ns, r.sync_fallback, r.input_wait_ns) for r in back] == [
        (r.slot, r.slot_wait_ns, r.sync_fallback, r.input_wait_ns) for r in recs]
    assert all(isinstance(r.sync_fallback, SyncFallback) for r in back)


def test_a_recording_with_an_unknown_reason_is_refused_by_name(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "step", "step": 0, "mode": "async", "slot": 0,
                                "num_requests": 1, "prefill_tokens": 0, "decode_tokens": 1,
                                "spans": [], "sync_fallback": "tired"}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: .*sync_fallback 'tired' is none of "
                                         r"'single slot', "):
        load_recording(path)


def test_the_slot_facts_cross_the_process_boundary():
    """The dashboard reads records from the engine process: the wire keeps the facts."""
    rec = StepRecord(step=4, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                     decode_tokens=1, spans=[Span("h2d", 0, 5), Span("compute", 9, 20)],
                     slot_wait_ns=7, sync_fallback=SyncFallback.SINGLE_SLOT)
    (back,) = decode_steps(pickle.loads(pickle_frame(encode_steps([rec]))))
    assert back.sync_fallback is SyncFallback.SINGLE_SLOT
    assert (back.slot_wait_ns, back.input_wait_ns) == (7, 4)


def test_a_preempted_request_waiting_for_its_token_is_named_preemption(model_dir, prompts):
    """The only request is preempted while its token is in flight (what the scheduler does
    when blocks run out): nothing can be scheduled until that token is read."""
    eng = make_engine(model_dir, async_batching=True, num_slots=2)
    reader = eng.bus.reader()
    h = eng.submit(prompts[1], SamplingParams(max_tokens=10, **GREEDY))
    try:
        for _ in range(4):
            eng.step()
        in_flight = eng.loop.inflight.step
        req = eng.scheduler.running[0]
        assert req.num_pending == 1
        eng.scheduler._preempt(req)
        drive(eng)
        assert h.result(1).finish_reason == "length"
    finally:
        eng.shutdown()
    recs = {r.step: r for r in reader.steps()}
    assert recs[in_flight].sync_fallback is SyncFallback.PREEMPTION
