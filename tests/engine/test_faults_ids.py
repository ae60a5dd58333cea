"""Request ids at the boundary: an abort never touches a later
request that reuses the id, unhashable or non-string ids are refused before anything is
queued, a finished id is free again at once, and engine-made ids never collide with a
caller's. Batch-mates of every fault finish with their solo tokens."""

from __future__ import annotations

import threading

import pytest
from engine_checks import assert_all_blocks_free

from engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_num_seqs=6,
                       max_num_batched_tokens=32, block_size=4, num_blocks=128,
                       max_model_len=96)
    eng = Engine(cfg)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def solo(engine):
    return {p: engine.submit(list(p), GREEDY).result(60).token_ids
            for p in ((3, 4, 5), (9, 8, 7, 6), (11, 12))}


def test_abort_then_submit_with_the_same_id_runs_the_new_request(engine, solo):
    other = engine.submit([9, 8, 7, 6], GREEDY)
    for i in range(10):
        engine.abort(f"x{i}")  # unknown now: ignored, and never applied to the next one
        h = engine.submit([3, 4, 5], GREEDY, request_id=f"x{i}")
        out = h.result(60)
        assert out.finish_reason == "length" and out.token_ids == solo[(3, 4, 5)]
    assert other.result(60).token_ids == solo[(9, 8, 7, 6)]
    assert_all_blocks_free(engine)


def test_abort_and_resubmit_from_many_threads_fails_no_request(engine, solo):
    outs, errors = [], []

    def worker(k: int) -> None:
        try:
            for i in range(5):
                rid = f"t{k}-{i}"
                engine.abort(rid)
                outs.append(engine.submit([11, 12], GREEDY, request_id=rid).result(120))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors
    assert len(outs) == 40
    assert all(o.finish_reason == "length" and o.token_ids == solo[(11, 12)] for o in outs)


@pytest.mark.parametrize("bad", [["x"], {}, 5, None, b"x", ""])
def test_abort_with_a_bad_id_is_refused_and_touches_nothing(engine, solo, bad):
    h = engine.submit([9, 8, 7, 6], GREEDY)
    with pytest.raises(ValueError, match="request_id must be"):
        engine.abort(bad)
    assert h.result(60).token_ids == solo[(9, 8, 7, 6)]


@pytest.mark.parametrize("bad", [["x"], 7, b"id", ""])
def test_submit_with_a_bad_id_is_refused(engine, bad):
    before = engine.stats()["unfinished"]
    with pytest.raises(ValueError, match="request_id must be"):
        engine.submit([1, 2], GREEDY, request_id=bad)
    assert engine.stats()["unfinished"] == before


def test_an_open_id_is_refused_and_a_finished_one_is_free_at_once(engine, solo):
    long = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    h = engine.submit([1, 2, 3], long, request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        engine.submit([1, 2, 3], GREEDY, request_id="dup")
    engine.abort("dup")
    assert h.result(60).finish_reason == "abort"
    for _ in range(3):  # no waiting period: the id is free as soon as its end was delivered
        out = engine.submit([3, 4, 5], GREEDY, request_id="dup").result(60)
        assert out.token_ids == solo[(3, 4, 5)]


def test_engine_made_ids_skip_ids_callers_hold(engine):
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    taken = [engine.submit([5, 6], long, request_id=f"req-{i}") for i in range(200)]
    mine = [engine.submit([5, 6], GREEDY) for _ in range(5)]
    ids = {h.request_id for h in taken}
    assert not ids & {h.request_id for h in mine}
    for h in taken:
        engine.abort(h.request_id)
    assert all(h.result(30).finish_reason == "length" for h in mine)
    assert all(h.result(30).finish_reason in ("abort", "length") for h in taken)
