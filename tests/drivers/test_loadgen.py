"""The load generator keeps the asked concurrency (or rate), stays bounded, and stops: on
stop(), aborting what it left in flight, and by itself when the engine shuts down."""

from __future__ import annotations

import time

import pytest

from engine import Engine, EngineConfig
from engine.drivers.loadgen import LoadGenerator, LoadSpec

SMALL = dict(device="cpu", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), **SMALL))
    yield eng
    eng.shutdown()


def in_flight(eng: Engine) -> int:
    s = eng.stats()
    return s["running"] + s["waiting"]


def wait_idle(eng: Engine, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while in_flight(eng) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_flight(eng) == 0, f"engine still serving {eng.stats()} after {timeout} s"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(rate=4.0), "exactly one of concurrency or rate"),
        (dict(concurrency=None), "exactly one of concurrency or rate"),
        (dict(concurrency=0), "concurrency must be an integer from 1"),
        (dict(concurrency=True), "concurrency must be an integer"),
        (dict(concurrency=None, rate=-1.0), "rate must be a number of requests per second > 0"),
        (dict(concurrency=None, rate=float("inf")), "rate must be"),
        (dict(prompt_len=0), "prompt_len must be an integer >= 1"),
        (dict(max_tokens=2.5), "max_tokens must be an integer >= 1"),
        (dict(temperature=-0.1), "temperature must be a number >= 0"),
    ],
)
def test_load_spec_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoadSpec(**kwargs)


def test_too_long_for_the_engine_is_refused(engine):
    with pytest.raises(ValueError, match="exceeds the engine's max_model_len of 256"):
        LoadGenerator(engine, LoadSpec(prompt_len=200, max_tokens=100))


def test_keeps_the_requested_concurrency_then_stops(engine):
    gen = LoadGenerator(engine, LoadSpec(concurrency=3, prompt_len=8, max_tokens=24)).start()
    try:
        samples = []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            samples.append(in_flight(engine))
            time.sleep(0.003)
        assert gen.running
        assert gen.finished >= 3, "requests should have finished and been replaced"
    finally:
        gen.stop()
    assert max(samples) <= 3, f"more than 3 in flight: {max(samples)}"
    at_three = sum(1 for s in samples if s == 3) / len(samples)
    assert at_three > 0.7, f"3 requests in flight only {at_three:.0%} of the time"
    assert not gen.running
    assert gen.submitted - gen.finished <= 3
    assert gen.errors == 0
    wait_idle(engine, 2.0)  # stop() aborted what was still in flight
    # Aborted requests are counted apart, never as finished.
    assert gen.inflight == 0 and gen.finished + gen.aborted == gen.submitted
    assert gen.stats()["aborted"] == gen.aborted <= 3


def test_requests_aborted_by_stop_are_not_counted_as_finished(engine):
    """The load's 'finished' never includes the requests stop() aborted."""
    wait_idle(engine)
    gen = LoadGenerator(engine, LoadSpec(concurrency=2, prompt_len=8, max_tokens=240)).start()
    deadline = time.monotonic() + 5.0
    while gen.submitted < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    gen.stop()  # long before 240 tokens: both are aborted
    stats = gen.stats()
    assert (stats["submitted"], stats["aborted"], stats["finished"]) == (2, 2, 0), stats


def test_rate_mode_submits_about_rate_per_second(engine):
    gen = LoadGenerator(
        engine, LoadSpec(concurrency=None, rate=40.0, prompt_len=4, max_tokens=4)
    ).start()
    time.sleep(1.0)
    gen.stop()
    # Poisson with mean 40: [15, 70] holds with overwhelming probability.
    assert 15 <= gen.submitted <= 70, gen.stats()
    assert gen.dropped == 0
    wait_idle(engine)


def test_rate_mode_is_bounded_when_the_engine_cannot_keep_up(engine):
    gen = LoadGenerator(
        engine, LoadSpec(concurrency=None, rate=2000.0, prompt_len=4, max_tokens=64), max_inflight=2
    ).start()
    peak = 0
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        peak = max(peak, gen.inflight)
        time.sleep(0.002)
    gen.stop()
    assert peak <= 2
    assert gen.dropped > 0, "arrivals beyond max_inflight should be dropped, not queued"
    wait_idle(engine)


def test_stops_by_itself_when_the_engine_shuts_down(tiny_model_dir):
    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), **SMALL))
    gen = LoadGenerator(eng, LoadSpec(concurrency=4, prompt_len=4, max_tokens=200)).start()
    time.sleep(0.2)
    assert gen.running
    eng.shutdown()
    deadline = time.monotonic() + 2.0
    while gen.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not gen.running
    assert "shut down" in (gen.stopped_reason or "")
