"""A 1,000-request load as a test: requests arrive while the mode and the
slot count switch live every ~50 ms and ~5% of requests are aborted. Every request ends
exactly once; every one that was not aborted has its solo sync run's tokens; an aborted one
has a prefix of them; nothing is held at the end. Sized for a 2-core CI machine."""

from __future__ import annotations

import random
import threading
import time

import pytest
from engine_checks import assert_all_blocks_free

from engine import Engine, EngineConfig, SamplingParams

NUM_REQUESTS = 1000
CFG = dict(device="cpu", max_num_seqs=16, max_num_batched_tokens=64, block_size=4,
           num_blocks=160, max_model_len=48)
PARAMS = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, detokenize=False)


@pytest.mark.slow
def test_a_thousand_requests_with_live_switching_and_aborts(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    rng = random.Random(10)
    prompts = [[rng.randrange(1, 300) for _ in range(rng.randint(2, 12))] for _ in range(40)]
    with Engine(EngineConfig(model=str(model_dir), async_batching=False, **CFG),
                start=False) as ref:
        solo = [ref.generate([p], PARAMS)[0].token_ids for p in prompts]

    eng = Engine(EngineConfig(model=str(model_dir), async_batching=True, **CFG))
    ends: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def on_finish(out) -> None:
        with lock:
            ends[out.request_id] = ends.get(out.request_id, 0) + 1

    def switcher() -> None:
        r = random.Random(3)
        try:
            while not stop.is_set():
                eng.configure(async_batching=r.random() < 0.7, num_slots=r.choice([1, 2, 3]))
                time.sleep(0.05)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    sw = threading.Thread(target=switcher)
    sw.start()
    submitted: list[tuple[int, object]] = []
    aborted: set[str] = set()
    t0 = time.monotonic()
    try:
        for _ in range(NUM_REQUESTS):
            k = rng.randrange(len(prompts))
            h = eng.submit(prompts[k], PARAMS, on_finish=on_finish)
            submitted.append((k, h))
            if rng.random() < 0.05:
                eng.abort(h.request_id)
                aborted.add(h.request_id)
            while eng.stats()["unfinished"] > 48:  # arrivals at about the serving rate
                time.sleep(0.002)
        outs = [(k, h.result(120)) for k, h in submitted]
    finally:
        stop.set()
        sw.join(30)
    elapsed = time.monotonic() - t0
    try:
        assert not errors, errors
        assert len(ends) == NUM_REQUESTS and set(ends.values()) == {1}, "an end came twice"
        for k, o in outs:
            if o.request_id in aborted:
                assert o.finish_reason in ("abort", "length"), o
                assert o.token_ids == solo[k][: len(o.token_ids)]
            else:
                assert o.finish_reason == "length" and o.token_ids == solo[k], o
        assert sum(o.finish_reason == "abort" for _, o in outs) >= 10
        eng.configure(async_batching=False)  # drains the pipeline
        assert_all_blocks_free(eng)
        assert eng.stats()["unfinished"] == 0
    finally:
        eng.shutdown()
    print(f"{NUM_REQUESTS} requests in {elapsed:.1f} s")
