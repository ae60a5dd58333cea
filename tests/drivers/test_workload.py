"""run_benchmark runs the same workload once per mode, yields progress and one result per
mode with real figures and step records, refuses a busy engine, and restores the settings
(also after an error or an early stop)."""

from __future__ import annotations

import time

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.drivers.workload import (
    BenchmarkProgress,
    BenchmarkResult,
    BenchmarkSpec,
    default_modes,
    mode_label,
    run_benchmark,
)

SMALL = dict(device="cpu", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
SPEC = dict(num_requests=4, prompt_len=12, max_tokens=10)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), **SMALL))
    yield eng
    eng.shutdown()


def live(eng: Engine) -> tuple[bool, int, bool]:
    s = eng.settings()
    return s["async_batching"], s["num_slots"], s["cuda_graphs"]


def test_default_modes_and_labels():
    assert [mode_label(m) for m in default_modes()] == ["sync", "async"]
    assert [mode_label(m) for m in default_modes(cuda_graphs=True)] == [
        "sync",
        "async",
        "sync+graphs",
        "async+graphs",
    ]
    assert mode_label({"async_batching": True, "num_slots": 3}) == "async 3 slots"
    assert mode_label({"async_batching": False, "max_num_batched_tokens": 64}) == \
        "sync budget 64"
    assert mode_label({"label": "mine", "async_batching": False}) == "mine"


def test_one_result_per_mode_with_progress_and_records(engine):
    engine.configure(async_batching=True, num_slots=3)
    items = list(run_benchmark(engine, BenchmarkSpec(**SPEC)))
    results = [i for i in items if isinstance(i, BenchmarkResult)]
    assert [r.mode_label for r in results] == ["sync", "async"]
    for r in results:
        progress = [
            i.done
            for i in items
            if isinstance(i, BenchmarkProgress) and i.mode_label == r.mode_label
        ]
        assert progress[0] == 0 and progress[-1] == 4
        assert progress == sorted(progress)
        assert r.generated_tokens == 4 * 10
        assert r.tokens_per_s > 0 and r.total_s > 0
        assert r.tokens_per_s == pytest.approx(r.generated_tokens / r.total_s)
        assert 0 < r.gpu_busy <= 1
        assert r.num_steps == len(r.records) > 0
        assert {rec.mode for rec in r.records} == {r.mode_label}
        assert sum(rec.decode_tokens for rec in r.records) >= 4 * 9
        assert r.idle_total_s >= 0 and r.idle_gaps >= 1
    # In sync mode the compute lane idles between every two steps (the CPU reads results,
    # then prepares the next step, while it waits).
    sync = results[0]
    assert sync.idle_gaps >= sync.num_steps - 1 and sync.gpu_busy < 1
    assert results[0].settings["async_batching"] is False
    assert results[1].settings["async_batching"] is True
    # The sync run predicts its async time (less than its own), idle split by cause.
    sync, asyn = results
    assert 0 < sync.predicted_async_s < sync.total_s and asyn.predicted_async_s is None
    for r in results:
        assert sum(r.idle_by_cause_s.values()) == pytest.approx(r.idle_total_s, abs=1e-6)
    assert results[0].tokens_digest == results[1].tokens_digest, "greedy output changed by mode"
    assert live(engine) == (True, 3, False), "the caller's settings were not restored"


def test_refuses_while_other_requests_are_in_flight(engine):
    h = engine.submit([1, 2, 3], SamplingParams(max_tokens=200, ignore_eos=True))
    try:
        with pytest.raises(ValueError, match="serving 1 other request"):
            run_benchmark(engine, BenchmarkSpec(**SPEC))
    finally:
        engine.abort(h.request_id)
        h.result(timeout=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_requests=0), "num_requests must be an integer >= 1"),
        (dict(prompt_len=200, max_tokens=100), "exceeds the engine's max_model_len of 256"),
        (dict(modes=[{"async": True}]), "unknown benchmark mode key 'async'"),
        (dict(modes=["sync"]), "a benchmark mode is a dict"),
    ],
)
def test_bad_spec_is_refused_before_running(engine, kwargs, message):
    with pytest.raises(ValueError, match=message):
        run_benchmark(engine, BenchmarkSpec(**{**SPEC, **kwargs}))
    assert engine.stats()["running"] == 0


def test_settings_restored_after_a_mode_fails(engine):
    before = live(engine)
    runs = run_benchmark(
        engine, BenchmarkSpec(**SPEC, modes=[{"async_batching": False}, {"cuda_graphs": True}])
    )
    results = []
    with pytest.raises(ValueError, match="cuda_graphs cannot be turned on"):
        for item in runs:
            if isinstance(item, BenchmarkResult):
                results.append(item)
    assert [r.mode_label for r in results] == ["sync"]
    assert live(engine) == before


def test_stopping_early_aborts_and_restores(engine):
    engine.configure(async_batching=True, num_slots=2)
    runs = run_benchmark(
        engine,
        BenchmarkSpec(
            num_requests=4, prompt_len=8, max_tokens=200, modes=[{"async_batching": False}]
        ),
    )
    first = next(runs)
    assert first == BenchmarkProgress("sync", 0, 4)
    runs.close()
    assert live(engine) == (True, 2, False)
    deadline = time.monotonic() + 3
    while engine.stats()["running"] + engine.stats()["waiting"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats()["running"] == 0, "the benchmark's requests were left running"


def test_a_run_longer_than_the_bus_ring_keeps_every_step(tiny_model_dir):
    """The bus keeps 96 steps here; the run has ~400, and the caller takes its time between
    progress items (as a dashboard does): the result still covers every step.

    The ring must still hold what arrives between two drains of the benchmark's collector
    (every 50 ms): the tiny model's steps take a millisecond or two on a CPU, so a 32-step
    ring fills within one drain period and loses steps whenever a drain comes late (with one
    torch thread a process, as the suite runs); 96 steps hold a few drain periods."""
    from telemetry.bus import TelemetryBus

    ring, new_tokens = 96, 400
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")),
                              **{**SMALL, "max_model_len": 512}))
    try:
        eng.bus = eng.loop.bus = TelemetryBus(step_capacity=ring)
        spec = BenchmarkSpec(num_requests=2, prompt_len=12, max_tokens=new_tokens,
                             warmup=False, modes=[{"async_batching": False}])
        results = []
        for item in run_benchmark(eng, spec):
            if isinstance(item, BenchmarkResult):
                results.append(item)
            else:
                time.sleep(0.3)  # a slow consumer
        (r,) = results
    finally:
        eng.shutdown()
    steps = [rec.step for rec in r.records]
    assert r.steps_dropped == 0 and r.num_steps == len(steps) > 3 * ring
    assert steps == list(range(steps[0], steps[0] + len(steps)))  # no step missing
    assert sum(rec.prefill_tokens for rec in r.records) == 2 * 12
    assert sum(rec.decode_tokens for rec in r.records) == 2 * (new_tokens - 1)
