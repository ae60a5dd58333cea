"""The serving invariant under fire: many good requests in flight while a second thread
injects bad input of every kind through the Engine API (bad ids, bad params, bad prompts,
aborts of unknown and unhashable ids, callbacks raising SystemExit and others, a prompt whose
tokens the tokenizer cannot decode) and a third switches mode and slots live. Every good
request's tokens equal its solo sync run; every bad one is refused at once or ends "error"
alone; nothing is held at the end."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest
from engine_checks import PoisonedTokenizer, assert_all_blocks_free

from engine import Engine, EngineConfig, SamplingParams

CFG = dict(device="cpu", max_num_seqs=8, max_num_batched_tokens=24, block_size=4,
           num_blocks=72, max_model_len=64)
MAX_TOKENS = 8
TALKER = [3, 4, 5]


def raw(n: int = MAX_TOKENS, detokenize: bool = False) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=detokenize)


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randint(2, 20))] for _ in range(24)]
    poison_prompt = [17, 18, 19, 20]

    with Engine(EngineConfig(model=str(model_dir), async_batching=False, **CFG)) as eng:
        solo = [eng.submit(p, raw()).result(30).token_ids for p in prompts]
        poison_out = eng.submit(poison_prompt, raw()).result(30).token_ids
        # The prompt of the raising callbacks: its tokens decode to text at once.
        talker_out = eng.submit(TALKER, raw()).result(30).token_ids
    seen = {t for ids in [*solo, talker_out] for t in ids}
    # A token the poison prompt generates and, if possible, no good request does; good
    # requests that generate it anyway run with detokenize=False (decode never sees it).
    poison = next((t for t in poison_out if t not in seen), poison_out[0])
    return model_dir, prompts, solo, poison_prompt, poison


@pytest.mark.slow
def test_bad_input_and_live_switches_never_touch_good_requests(setup):
    model_dir, prompts, solo, poison_prompt, poison = setup
    eng = Engine(EngineConfig(model=str(model_dir), async_batching=True, **CFG))
    eng.loop.tokenizer = PoisonedTokenizer(eng.tokenizer, poison)
    stop = threading.Event()
    refused: list[str] = []
    bad_handles: list[tuple[str, object]] = []
    unexpected: list[BaseException] = []

    def must_refuse(what: str, fn) -> None:
        try:
            fn()
        except ValueError:
            refused.append(what)
        else:
            unexpected.append(AssertionError(f"{what} was accepted"))

    def boom_exit(rid, text):
        raise SystemExit(2)

    def boom_value(rid, text):
        raise ValueError("callback bug")

    def boom_finish(out):
        raise KeyboardInterrupt

    actions = [
        lambda: must_refuse("top_k", lambda: eng.submit([1, 2], {"top_k": 2**31})),
        lambda: must_refuse("nan", lambda: eng.submit([1, 2], {"temperature": math.nan})),
        lambda: must_refuse("seed", lambda: eng.submit([1, 2], {"seed": -1})),
        lambda: must_refuse("stop id", lambda: eng.submit([1, 2], {"stop_token_ids": [10**9]})),
        lambda: must_refuse("vocab", lambda: eng.submit([1, 10**6], raw())),
        lambda: must_refuse("empty", lambda: eng.submit([], raw())),
        lambda: must_refuse("surrogate", lambda: eng.submit("a\ud800", raw())),
        lambda: must_refuse("list id", lambda: eng.submit([1, 2], raw(), request_id=["x"])),
        lambda: must_refuse("abort list", lambda: eng.abort(["x"])),
        lambda: must_refuse("abort dict", lambda: eng.abort({})),
        lambda: must_refuse("generate mix", lambda: eng.generate([[1, 2], [10**6]], raw())),
        lambda: eng.abort(f"unknown-{random.random()}"),
        lambda: bad_handles.append(("exit", eng.submit(TALKER, raw(detokenize=True),
                                                       on_delta=boom_exit))),
        lambda: bad_handles.append(("value", eng.submit(TALKER, raw(detokenize=True),
                                                        on_delta=boom_value))),
        lambda: bad_handles.append(("poison", eng.submit(poison_prompt,
                                                         raw(detokenize=True)))),
        lambda: bad_handles.append(("finish", eng.submit([8, 9], raw(),
                                                         on_finish=boom_finish))),
    ]

    def injector() -> None:
        rng = random.Random(1)
        try:
            for _ in range(160):  # ~40 bad requests in flight at most: bounded extra load
                if stop.is_set():
                    return
                rng.choice(actions)()
                time.sleep(0.01)
        except BaseException as e:  # pragma: no cover - reported below
            unexpected.append(e)

    def switcher() -> None:
        rng = random.Random(2)
        try:
            while not stop.is_set():
                eng.configure(async_batching=rng.random() < 0.6, num_slots=rng.choice([1, 2, 3]))
                time.sleep(0.03)
        except BaseException as e:  # pragma: no cover - reported below
            unexpected.append(e)

    threads = [threading.Thread(target=injector), threading.Thread(target=switcher)]
    for t in threads:
        t.start()
    try:
        good = []
        for i, p in enumerate(prompts):
            detok = poison not in solo[i]
            good.append(eng.submit(p, raw(detokenize=detok)))
            time.sleep(0.01)
        outs = [h.result(60) for h in good]
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    try:
        assert not unexpected, unexpected
        for i, o in enumerate(outs):
            assert o.finish_reason == "length" and o.error is None, (i, o.error)
            assert o.token_ids == solo[i], f"good request {i} diverged"
        assert len(set(refused)) >= 8, sorted(set(refused))
        kinds = {k for k, _ in bad_handles}
        assert {"exit", "value", "poison"} <= kinds, kinds
        for kind, h in bad_handles:
            o = h.result(60)
            if kind == "finish":
                assert o.finish_reason == "length"
            else:
                assert o.finish_reason == "error", (kind, o)
                want = {"exit": "SystemExit", "value": "callback bug",
                        "poison": f"cannot decode token {poison}"}[kind]
                assert want in o.error, (kind, o.error)
        assert eng.dead_reason is None
        deadline = time.monotonic() + 10
        while eng.stats()["running"] + eng.stats()["waiting"] and time.monotonic() < deadline:
            time.sleep(0.01)
        eng.configure(async_batching=False)  # drains the pipeline
        assert_all_blocks_free(eng)
    finally:
        eng.shutdown()
