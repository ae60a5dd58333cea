"""Bad input is refused at the boundary, before anything is queued: values that would overflow
the device's int32/float32 fields, a prompt too long to tokenize, text that is not UTF-8, and
generate() calls that are all-or-nothing."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=4,
                       max_num_batched_tokens=32, block_size=4, num_blocks=64,
                       max_model_len=96)
    eng = Engine(cfg)
    yield eng
    eng.shutdown()


def nothing_queued(engine: Engine) -> bool:
    return engine.stats()["unfinished"] == 0


@pytest.mark.parametrize(("params", "message"), [
    ({"top_k": 2**31}, "top_k must be -1 (off) or an integer in [1, 2147483647]"),
    ({"top_k": 2**40}, "top_k must be"),
    ({"seed": 2**31}, "seed must be None or an integer in [0, 2147483647]"),
    ({"seed": -1}, "seed must be"),
    ({"max_tokens": 2**31}, "max_tokens must be an integer in [1, 2147483647]"),
    ({"stop_token_ids": [2**31]}, "stop_token_ids must be a list of token ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids must be a list of token ids"),
    ({"stop_token_ids": [100_000]}, "stop token id 100000 is outside the vocabulary"),
    ({"temperature": math.inf}, "temperature must be >= 0 and finite"),
    ({"temperature": math.nan}, "temperature must be >= 0 and finite"),
    ({"temperature": 1e39}, "temperature must be >= 0 and finite"),
    ({"top_p": math.nan}, "top_p must be in (0, 1]"),
])
def test_out_of_range_params_are_refused_before_queueing(engine, params, message):
    with pytest.raises(ValueError) as err:
        engine.submit([1, 2, 3], params)
    assert message in str(err.value)
    assert nothing_queued(engine)


def test_the_largest_allowed_values_run_beside_other_requests(engine):
    mate = engine.submit([7, 8, 9], GREEDY)
    big = engine.submit([1, 2, 3], SamplingParams(max_tokens=6, temperature=0.7,
                                                  top_k=2**31 - 1, seed=2**31 - 1,
                                                  stop_token_ids=[0]))
    alone = engine.submit([7, 8, 9], GREEDY).result(60)
    out = big.result(60)
    assert out.finish_reason in ("length", "stop") and out.error is None
    assert mate.result(60).token_ids == alone.token_ids


def test_a_huge_prompt_is_refused_before_tokenizing(engine):
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="characters; with max_model_len=96 it cannot fit"):
        engine.submit("x" * 10_000_000, GREEDY)
    assert time.monotonic() - t0 < 1.0  # tokenizing it would take many seconds
    assert nothing_queued(engine)


@pytest.mark.parametrize("prompt", ["abc\ud800def", "\udcff"])
def test_a_prompt_that_is_not_utf8_is_refused_clearly(engine, prompt):
    with pytest.raises(ValueError, match="encodes as UTF-8"):
        engine.submit(prompt, GREEDY)


def test_a_callback_that_is_not_callable_is_refused(engine):
    with pytest.raises(ValueError, match="on_delta must be a callable or None"):
        engine.submit([1, 2], GREEDY, on_delta="print")
    assert nothing_queued(engine)


def test_generate_is_all_or_nothing(engine):
    steps = engine.stats()["steps"]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.generate([[1, 2, 3], [1, 10**6]], GREEDY)
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[1, 2, 3], [4, 5]], [GREEDY, {"top_p": 2.0}])
    time.sleep(0.2)
    assert nothing_queued(engine) and engine.stats()["steps"] == steps


@pytest.mark.parametrize(("prompts", "params", "message"), [
    ([[1, 2], [3, 4]], [GREEDY], "got 2 prompts and 1 sampling params"),
    ([[1, 2]], [GREEDY, GREEDY], "got 1 prompts and 2 sampling params"),
    (np.array([1, 2, 3]), None, "prompts must be a string, a list of token ids"),
    ({"prompt": "x"}, None, "prompts must be a string, a list of token ids"),
    (None, None, "prompts must be a string, a list of token ids"),
    ([], None, "prompts is empty"),
    ([np.int64(3)], None, "prompt must be a string or a list of token ids"),
])
def test_generate_explains_bad_arguments(engine, prompts, params, message):
    with pytest.raises(ValueError) as err:
        engine.generate(prompts, params)
    assert message in str(err.value)
    assert nothing_queued(engine)


def test_generate_takes_one_params_per_prompt(engine):
    a, b = engine.generate([[1, 2], [3, 4]], [GREEDY, {"max_tokens": 2, "temperature": 0.0}])
    assert len(a.token_ids) == 6 and len(b.token_ids) == 2
