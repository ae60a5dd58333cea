"""Requests joining a running batch, aborts, and the rejection of bad input."""

from __future__ import annotations

import time

import pytest
from engine_checks import assert_all_blocks_free, hf_greedy, mixed_prompts

from engine import Engine, EngineConfig, SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=4,
                       max_num_batched_tokens=32, block_size=4, num_blocks=64,
                       max_model_len=96)
    eng = Engine(cfg)
    yield eng
    eng.shutdown()


def wait_idle(eng: Engine, timeout: float = 10.0) -> None:
    t = time.monotonic() + timeout
    while eng.stats()["running"] or eng.stats()["waiting"]:
        assert time.monotonic() < t, "engine did not go idle"
        time.sleep(0.01)


def test_requests_submitted_while_others_decode(engine, tiny_model_dir):
    prompts = mixed_prompts(6, seed=3)
    expected = hf_greedy(tiny_model_dir("llama"), prompts, 20)
    first = [engine.submit(p, SamplingParams(max_tokens=20, **GREEDY)) for p in prompts[:3]]
    # Wait until the first ones are decoding, then add more.
    deadline = time.monotonic() + 10
    while engine.stats()["generated_tokens"] < 3:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    late = [engine.submit(p, SamplingParams(max_tokens=20, **GREEDY)) for p in prompts[3:]]
    outs = [h.result(timeout=30) for h in first + late]
    assert [o.token_ids for o in outs] == expected
    wait_idle(engine)
    assert_all_blocks_free(engine)


def test_streamed_deltas_join_to_the_final_text(engine):
    h = engine.submit("def add(a, b):", SamplingParams(max_tokens=16, **GREEDY))
    text = "".join(h)
    out = h.result(timeout=10)
    assert text == out.text
    assert out.text == engine.tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_abort_frees_the_request_blocks(engine):
    h = engine.submit(list(range(1, 40)), SamplingParams(max_tokens=80, **GREEDY))
    deadline = time.monotonic() + 10
    while engine.stats()["kv_blocks_used"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    engine.abort(h.request_id)
    out = h.result(timeout=10)
    assert out.finish_reason == "abort"
    assert len(out.token_ids) < 80
    wait_idle(engine)
    assert_all_blocks_free(engine)


def test_abort_of_a_waiting_request(engine):
    hs = [engine.submit([5] * 30, SamplingParams(max_tokens=40, **GREEDY)) for _ in range(6)]
    engine.abort(hs[-1].request_id)  # max_num_seqs=4: the last one is still waiting
    outs = [h.result(timeout=30) for h in hs]
    assert outs[-1].finish_reason == "abort"
    assert all(o.finish_reason == "length" for o in outs[:-1])
    wait_idle(engine)
    assert_all_blocks_free(engine)


BAD_INPUTS = [
    ("", {}, "prompt is empty"),
    ([], {}, "prompt is empty"),
    ([1] * 96, {}, "at most 95 tokens"),
    ([1, 2, 10_000], {}, "outside the vocabulary"),
    ([1, -1], {}, "outside the vocabulary"),
    ([1, "a"], {}, "must be integers"),
    (3.5, {}, "must be a string or a list of token ids"),
    ([1, 2], {"max_tokens": 0}, "max_tokens must be an integer in [1, 2147483647]"),
    ([1, 2], {"temperature": -0.5}, "temperature must be >= 0 and finite"),
    ([1, 2], {"top_p": 0.0}, "top_p must be in (0, 1]"),
    ([1, 2], {"top_p": 1.5}, "top_p must be in (0, 1]"),
    ([1, 2], {"top_k": 0}, "top_k must be -1 (off) or an integer in [1, 2147483647]"),
    ([1, 2], {"top_k": -2}, "top_k must be -1 (off) or an integer in [1, 2147483647]"),
    ([1, 2], {"stop": "abc"}, "stop must be a list of strings"),
    ([1, 2], {"stop": [1, 2]}, "stop must be a list of non-empty strings"),
    ([1, 2], {"bogus": 1}, "unknown sampling parameter 'bogus'"),
]


@pytest.mark.parametrize(("prompt", "params", "message"), BAD_INPUTS)
def test_bad_input_is_rejected_and_the_engine_keeps_serving(engine, prompt, params, message):
    with pytest.raises(ValueError) as exc:
        engine.submit(prompt, params)
    assert message in str(exc.value)
    out = engine.submit([7, 8, 9], SamplingParams(max_tokens=3, **GREEDY)).result(timeout=10)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    wait_idle(engine)
    assert_all_blocks_free(engine)


def test_stop_string_ends_the_request_and_is_not_emitted(engine):
    full = engine.submit("def add(a, b):", SamplingParams(max_tokens=24, **GREEDY)).result(10)
    assert len(full.text) > 4
    stop = full.text[3:5]
    cut = engine.submit("def add(a, b):", SamplingParams(max_tokens=24, stop=[stop], **GREEDY))
    streamed = "".join(cut)
    out = cut.result(10)
    assert out.finish_reason == "stop"
    assert out.text == full.text[: full.text.find(stop)]
    assert streamed == out.text


def test_eos_stops_and_the_late_token_is_discarded(tiny_model_dir):
    """Make the model's first greedy token the EOS id: in async mode the step after it was
    already queued; its token must be discarded, never emitted."""
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=4,
                       max_num_batched_tokens=32, block_size=4, num_blocks=64,
                       max_model_len=96, async_batching=True, num_slots=2)
    with Engine(cfg) as eng:
        probe = eng.generate([[3, 4, 5]], SamplingParams(max_tokens=4, **GREEDY))[0]
        eng.loop.eos_ids = {probe.token_ids[1]}  # the second token will be "EOS"
        out = eng.generate([[3, 4, 5]], SamplingParams(max_tokens=8, temperature=0.0))[0]
        assert out.finish_reason == "stop"
        assert out.token_ids == probe.token_ids[:2]
        deadline = time.monotonic() + 10  # the late step is read on the next loop turn
        while eng.stats()["discarded_tokens"] < 1:
            assert time.monotonic() < deadline, "the one-step-late token was never computed"
            time.sleep(0.001)
        assert out.token_ids == probe.token_ids[:2]
        assert_all_blocks_free(eng)


def test_callbacks_see_every_delta_and_the_end(engine):
    seen: list[str] = []
    ends = []
    h = engine.submit("import os\n", SamplingParams(max_tokens=10, **GREEDY),
                      on_delta=lambda rid, d: seen.append(d), on_finish=ends.append)
    out = h.result(timeout=10)
    assert "".join(seen) == out.text and len(ends) == 1
    assert ends[0].request_id == h.request_id and ends[0].token_ids == out.token_ids


def test_a_request_stops_at_max_model_len(engine):
    # max_model_len=96: a 90-token prompt may generate at most 6 tokens whatever max_tokens.
    out = engine.submit([3] * 90, SamplingParams(max_tokens=50, **GREEDY)).result(timeout=10)
    assert out.finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.token_ids) == 96
    wait_idle(engine)
    assert_all_blocks_free(engine)


def test_a_seeded_sampled_request_is_reproducible_whatever_runs_beside_it(engine):
    sp = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    alone = engine.submit([5, 6, 7], sp).result(timeout=10).token_ids
    others = [engine.submit([9] * n, SamplingParams(max_tokens=12, temperature=1.0))
              for n in (3, 11, 20)]
    batched = engine.submit([5, 6, 7], sp).result(timeout=10).token_ids
    [h.result(timeout=10) for h in others]
    other_seed = engine.submit([5, 6, 7], SamplingParams(max_tokens=16, temperature=0.9,
                                                         top_p=0.95, seed=99)).result(10)
    assert alone == batched
    assert other_seed.token_ids != alone


def test_an_unexpected_error_in_the_loop_fails_requests_and_serving_goes_on(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=4,
                       max_num_batched_tokens=32, block_size=4, num_blocks=64,
                       max_model_len=96, async_batching=True, num_slots=1)
    with Engine(cfg) as eng:
        real = eng.loop._on_token
        calls = {"n": 0}

        def flaky(req, token):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected bug in post")
            return real(req, token)

        eng.loop._on_token = flaky
        bad = eng.submit([3, 4, 5], SamplingParams(max_tokens=8, **GREEDY)).result(timeout=10)
        assert bad.finish_reason == "error" and "injected bug in post" in bad.error
        eng.loop._on_token = real
        ok = eng.submit([3, 4, 5], SamplingParams(max_tokens=8, **GREEDY)).result(timeout=10)
        assert ok.finish_reason == "length" and len(ok.token_ids) == 8
        wait_idle(eng)
        assert_all_blocks_free(eng)
