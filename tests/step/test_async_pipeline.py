"""Sync and async modes, 1-3 slots and live switches all give the same greedy tokens; a slot
reused too early raises (generation counters) and, with them off, gives wrong tokens; the host
streams really overlap CPU prep with compute."""

from __future__ import annotations

import itertools

import pytest
from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts

from engine import Engine, EngineConfig, SamplingParams
from engine.step.pipeline import Pipeline
from engine.step.slot_guard import BufferGuard, SlotOverwriteError

GREEDY = dict(temperature=0.0, ignore_eos=True)
TIGHT = dict(device="cpu", max_num_seqs=5, max_num_batched_tokens=16, block_size=4,
             num_blocks=25, max_model_len=96)


def make_engine(model_dir, **kw) -> Engine:
    return Engine(EngineConfig(model=str(model_dir), **{**TIGHT, **kw}), start=False)


def drive(eng: Engine, max_steps: int = 5000, on_step=None) -> None:
    for n in range(max_steps):
        if on_step is not None:
            on_step(n)
        if not eng.step() and not eng.scheduler.num_unfinished and eng.loop.inflight is None:
            return
    raise AssertionError("workload did not finish")


@pytest.fixture(scope="module")
def workload(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    prompts = mixed_prompts(10, seed=7)
    return model_dir, prompts, hf_greedy(model_dir, prompts, 14)


def test_mixed_workload_with_arrivals_aborts_and_live_switches(workload):
    """Half the prompts arrive while the first half decode; two requests are aborted; the
    mode, the slot count, or both change every 3 steps."""
    model_dir, prompts, expected = workload
    eng = make_engine(model_dir)
    params = SamplingParams(max_tokens=14, **GREEDY)
    ends: dict[str, int] = {}

    def on_finish(out) -> None:
        ends[out.request_id] = ends.get(out.request_id, 0) + 1

    handles = {i: eng.submit(p, params, on_finish=on_finish) for i, p in enumerate(prompts[:5])}
    switches = itertools.cycle([
        dict(async_batching=False), dict(async_batching=True, num_slots=1),
        dict(num_slots=3), dict(async_batching=False, num_slots=2),
        dict(async_batching=True),
    ])
    aborted = {2, 7}

    def on_step(n: int) -> None:
        if n == 4:
            for i in range(5, 10):
                handles[i] = eng.submit(prompts[i], params, on_finish=on_finish)
        if n in (6, 12):
            eng.abort(handles[2 if n == 6 else 7].request_id)
        if n % 3 == 0:
            eng.configure(**next(switches))

    drive(eng, on_step=on_step)
    assert eng.stats()["preemptions"] > 0
    for i, h in handles.items():
        out = h.result(timeout=1)
        if i in aborted:
            assert out.finish_reason == "abort"
            assert out.token_ids == expected[i][: len(out.token_ids)]
        else:
            assert out.finish_reason == "length"
            assert out.token_ids == expected[i], f"request {i} diverged"
    # Every request ended exactly once, whatever the switches and aborts did.
    assert ends == {h.request_id: 1 for h in handles.values()}
    assert_all_blocks_free(eng)
    eng.shutdown()


@pytest.mark.parametrize("slow_lane", ["h2d", "compute", "d2h"])
@pytest.mark.parametrize("num_slots", [1, 2])
def test_a_slow_stream_never_lets_a_slot_be_reused_early(workload, slow_lane, num_slots):
    model_dir, prompts, expected = workload
    eng = make_engine(model_dir, async_batching=True, num_slots=num_slots)
    getattr(eng.streams, slow_lane).delay_s = 0.003
    hs = [eng.submit(p, SamplingParams(max_tokens=14, **GREEDY)) for p in prompts]
    drive(eng)
    assert [h.result(1).token_ids for h in hs] == expected
    assert_all_blocks_free(eng)
    eng.shutdown()


def test_an_early_slot_reuse_raises_loudly(workload, monkeypatch):
    """Without the wait for the slot's last H2D copy, the slot's generation counter refuses
    the next step's write of inputs still being copied: SlotOverwriteError, naming both."""
    model_dir, prompts, _ = workload
    monkeypatch.setattr(Pipeline, "wait_host_input", lambda self, slot: 0)
    eng = make_engine(model_dir, async_batching=True, num_slots=1)
    eng.streams.h2d.delay_s = 0.003
    hs = [eng.submit(p, SamplingParams(max_tokens=14, **GREEDY)) for p in prompts]
    try:
        with pytest.raises(SlotOverwriteError, match=r"slot 0 host input: step \d+ would "
                           r"overwrite step \d+'s data"):
            drive(eng)
        eng.loop.recover(RuntimeError("test"))  # what the engine thread does after a raise
        assert all(h.result(1).finish_reason == "error" for h in hs)
    finally:
        eng.shutdown()


def test_the_slot_test_can_fail(workload, monkeypatch):
    """Negative control: without the wait for the slot's last H2D copy (and with the
    generation counters off), a slow H2D stream makes the next step overwrite inputs still
    being copied, and tokens go wrong."""
    model_dir, prompts, expected = workload
    monkeypatch.setattr(Pipeline, "wait_host_input", lambda self, slot: 0)
    for method in ("claim", "check", "release"):
        monkeypatch.setattr(BufferGuard, method, lambda self, *a: None)
    eng = make_engine(model_dir, async_batching=True, num_slots=1)
    eng.streams.h2d.delay_s = 0.003
    hs = [eng.submit(p, SamplingParams(max_tokens=14, **GREEDY)) for p in prompts]
    try:
        drive(eng)  # a step that fails ends its requests with "error"; nothing escapes
        outs = [h.result(1) for h in hs]
    finally:
        eng.shutdown()
    wrong = [o for o, e in zip(outs, expected, strict=True)
             if o.finish_reason != "error" and o.token_ids != e]
    # Corrupt indices may also make a step fail (an index out of range): also a detection.
    index_errors = [o for o in outs if o.finish_reason == "error" and "index" in o.error.lower()]
    assert wrong or index_errors, "the early slot reuse went unnoticed"


def test_async_mode_overlaps_cpu_prep_with_compute(workload):
    """In async mode, the CPU prepares step N+1 while step N computes (host streams)."""
    model_dir, prompts, _ = workload
    eng = make_engine(model_dir, async_batching=True, num_slots=2)
    eng.streams.compute.delay_s = 0.002
    reader = eng.bus.reader()
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=14, **GREEDY))
    drive(eng)
    recs = {r.step: r for r in reader.steps()}
    overlapped = 0
    for step, rec in recs.items():
        nxt = recs.get(step + 1)
        if nxt is None:
            continue
        comp = next(s for s in rec.spans if s.lane == "compute")
        prep = next(s for s in nxt.spans if s.lane == "cpu.prepare")
        overlapped += prep.start_ns < comp.end_ns and prep.end_ns > comp.start_ns
    assert overlapped >= len(recs) // 2, f"only {overlapped} of {len(recs)} steps overlapped"
    eng.shutdown()


@pytest.mark.parametrize("async_batching", [False, True])
def test_spans_of_a_step_are_on_their_lanes_in_causal_order(workload, async_batching):
    model_dir, prompts, _ = workload
    eng = make_engine(model_dir, async_batching=async_batching, num_slots=2)
    reader = eng.bus.reader()
    for p in prompts[:4]:
        eng.submit(p, SamplingParams(max_tokens=6, **GREEDY))
    drive(eng)
    recs = reader.steps()
    assert recs and all(r.mode == ("async" if async_batching else "sync") for r in recs)
    for r in recs:
        lane = {s.lane: s for s in r.spans}
        assert sorted(lane) == sorted(["cpu.schedule", "cpu.prepare", "cpu.launch", "cpu.wait",
                                       "cpu.post", "h2d", "compute", "d2h"])
        assert all(s.start_ns <= s.end_ns for s in r.spans)
        assert lane["cpu.schedule"].end_ns <= lane["cpu.prepare"].start_ns
        assert lane["cpu.prepare"].end_ns <= lane["cpu.launch"].start_ns
        assert lane["cpu.launch"].start_ns <= lane["h2d"].start_ns
        assert lane["h2d"].end_ns <= lane["compute"].start_ns
        assert lane["compute"].end_ns <= lane["d2h"].start_ns
        assert lane["d2h"].end_ns <= lane["cpu.wait"].end_ns <= lane["cpu.post"].start_ns
        assert r.num_requests >= 1 and r.prefill_tokens + r.decode_tokens >= 1
        assert r.graph_bucket is None and r.padded_tokens == 0
    eng.shutdown()


@pytest.mark.parametrize("async_batching", [False, True])
def test_a_failing_step_ends_its_requests_with_error_and_the_engine_keeps_serving(
        workload, async_batching):
    model_dir, prompts, expected = workload
    eng = make_engine(model_dir, async_batching=async_batching, num_slots=2)
    real = eng.runner.compute
    calls = {"n": 0}

    def flaky(view, t, s, greedy):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("injected device failure")
        return real(view, t, s, greedy)

    eng.runner.compute = flaky
    hs = [eng.submit(p, SamplingParams(max_tokens=14, **GREEDY)) for p in prompts[:4]]
    drive(eng)
    outs = [h.result(1) for h in hs]
    failed = [o for o in outs if o.finish_reason == "error"]
    assert failed, "the injected failure should have ended the requests of its step"
    assert all("injected device failure" in (o.error or "") for o in failed)
    for o, e in zip(outs, expected, strict=False):
        if o.finish_reason != "error":
            assert o.token_ids == e
    assert_all_blocks_free(eng)
    again = eng.submit(prompts[0], SamplingParams(max_tokens=14, **GREEDY))
    drive(eng)
    assert again.result(1).token_ids == expected[0]
    eng.shutdown()


def test_with_telemetry_off_nothing_is_timed_and_tokens_are_unchanged(workload):
    model_dir, prompts, expected = workload
    eng = make_engine(model_dir, async_batching=True, num_slots=1, telemetry=False)
    eng.streams.h2d.delay_s = 0.003  # untimed work still honours the slow-stream hook
    reader = eng.bus.reader()
    hs = [eng.submit(p, SamplingParams(max_tokens=14, **GREEDY)) for p in prompts]
    drive(eng)
    assert [h.result(1).token_ids for h in hs] == expected
    assert reader.steps() == [] and eng.bus.stats().steps_published == 0
    assert_all_blocks_free(eng)
    eng.shutdown()
