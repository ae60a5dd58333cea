"""Faults while serving, and the invariant: a request's own
fault (its tokenizer's decode, its callbacks, SystemExit included) ends that request alone
with "error" and a message; after an engine fault the engine can be reconfigured and serves
on; anything that escapes the loop thread marks the engine dead, ends every open request
with the reason, and makes later calls raise instead of hanging."""

from __future__ import annotations

import threading
import time

import pytest
from engine_checks import PoisonedTokenizer, assert_all_blocks_free

from engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
RAW = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, detokenize=False)
CFG = dict(device="cpu", max_num_seqs=6, max_num_batched_tokens=32, block_size=4,
           num_blocks=96, max_model_len=96)


def make(model_dir, **kw) -> Engine:
    return Engine(EngineConfig(model=str(model_dir), **{**CFG, **kw}))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def solo(model_dir):
    with make(model_dir, async_batching=False) as eng:
        return {p: eng.submit(list(p), RAW).result(60).token_ids
                for p in ((3, 4, 5), (9, 8, 7, 6), (11, 12), (20, 21, 22))}


@pytest.mark.parametrize("async_batching", [False, True])
def test_a_tokenizer_that_raises_fails_only_its_request(model_dir, solo, async_batching):
    others = {t for p, ids in solo.items() if p != (3, 4, 5) for t in ids}
    poison = next(t for t in solo[(3, 4, 5)] if t not in others)
    with make(model_dir, async_batching=async_batching) as eng:
        eng.loop.tokenizer = PoisonedTokenizer(eng.tokenizer, poison)
        bad = eng.submit([3, 4, 5], GREEDY)
        mates = {p: eng.submit(list(p), GREEDY if p != (11, 12) else RAW)
                 for p in ((9, 8, 7, 6), (11, 12), (20, 21, 22))}
        out = bad.result(60)
        assert out.finish_reason == "error" and f"cannot decode token {poison}" in out.error
        for p, h in mates.items():
            o = h.result(60)
            assert o.finish_reason == "length" and o.token_ids == solo[p], p
        time.sleep(0.1)
        assert_all_blocks_free(eng)


@pytest.mark.parametrize("exc", [ValueError("bad"), SystemExit(3), KeyboardInterrupt()])
def test_a_raising_on_delta_fails_only_its_request_and_the_loop_lives(model_dir, solo, exc):
    with make(model_dir, async_batching=True) as eng:

        def boom(rid, text):
            raise exc

        bad = eng.submit([3, 4, 5], GREEDY, on_delta=boom)
        mate = eng.submit([9, 8, 7, 6], RAW)
        out = bad.result(60)
        assert out.finish_reason == "error"
        assert f"on_delta callback raised {type(exc).__name__}" in out.error
        assert mate.result(60).token_ids == solo[(9, 8, 7, 6)]
        # The loop thread still serves.
        assert eng.submit([11, 12], RAW).result(60).token_ids == solo[(11, 12)]
        assert eng.dead_reason is None
        time.sleep(0.1)
        assert_all_blocks_free(eng)


def test_a_raising_on_finish_changes_nothing(model_dir, solo):
    with make(model_dir) as eng:
        def boom(out):
            raise SystemExit("from on_finish")

        out = eng.submit([3, 4, 5], RAW, on_finish=boom).result(60)
        assert out.finish_reason == "length" and out.token_ids == solo[(3, 4, 5)]
        assert eng.submit([11, 12], RAW).result(60).token_ids == solo[(11, 12)]


def test_configure_after_a_failed_async_step_applies_and_drops_nothing(model_dir, solo):
    with make(model_dir, async_batching=True, num_slots=2) as eng:
        real = eng.loop._on_token
        calls = {"n": 0}

        def flaky(req, token):  # an engine bug escaping the step, not a request's fault
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected bug")
            return real(req, token)

        eng.loop._on_token = flaky
        failed = eng.submit([3, 4, 5], RAW).result(60)
        assert failed.finish_reason == "error" and "injected bug" in failed.error
        eng.loop._on_token = real
        queued = eng.submit([9, 8, 7, 6], RAW)
        for n in (3, 1, 2):
            assert eng.configure(num_slots=n)["num_slots"] == n
        assert eng.configure(async_batching=False)["async_batching"] is False
        out = queued.result(60)
        assert out.finish_reason == "length" and out.token_ids == solo[(9, 8, 7, 6)]
        time.sleep(0.1)
        assert_all_blocks_free(eng)


@pytest.mark.parametrize("exc", [SystemExit(1), KeyboardInterrupt(), GeneratorExit()])
def test_anything_escaping_the_loop_marks_the_engine_dead_and_callers_are_told(model_dir, exc):
    eng = make(model_dir, async_batching=True)
    try:
        started = threading.Event()
        long = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
        h = eng.submit([3, 4, 5], long, on_delta=lambda rid, t: started.set())
        assert started.wait(60)
        real = eng.loop.step

        def dies():
            eng.loop.step = real
            raise exc

        eng.loop.step = dies
        out = h.result(60)
        assert out.finish_reason == "error"
        assert f"engine loop thread died ({type(exc).__name__}" in out.error
        assert eng.dead_reason is not None and type(exc).__name__ in eng.dead_reason
        with pytest.raises(RuntimeError, match="the engine stopped serving"):
            eng.submit([1, 2], RAW)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="the engine stopped serving"):
            eng.configure(num_slots=1)
        assert time.monotonic() - t0 < 2
    finally:
        t0 = time.monotonic()
        eng.shutdown()
        assert time.monotonic() - t0 < 10
