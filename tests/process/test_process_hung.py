"""A hung engine process (SIGSTOP) is reported within ~3 s as "not responding", distinct from
dead; no call or stream waits forever on it; restart() and shutdown() end it quickly; a submit
that is not confirmed leaves no work running; a kill mid-stream keeps the tokens that
streamed; and bad inputs through the client never touch good requests streaming beside them.

One engine process (tiny llama, CPU) serves the module; tests that kill it restart it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from engine.drivers.workload import BenchmarkSpec
from engine.process.client import EngineClient, EngineDead, EngineNotResponding

SMALL = dict(
    device="cpu", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16
)
LONG = dict(max_tokens=400, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    c = EngineClient(None, model=str(tiny_model_dir("llama")), give_up_after_s=4.0, **SMALL)
    yield c
    c.shutdown()


@pytest.fixture
def stopped(client):
    """SIGSTOP the engine process for the test; SIGCONT after (if it still exists)."""
    pid = client.pid
    os.kill(pid, signal.SIGSTOP)
    yield pid
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def wait_for(predicate, timeout: float, step: float = 0.02) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def idle(client) -> bool:
    s = client.stats()
    return s["running"] == 0 and s["waiting"] == 0 and s["unfinished"] == 0


def test_a_stopped_engine_is_not_responding_and_calls_fail_fast(client, stopped):
    assert client.status().state == "alive"
    waiting: list[BaseException | float] = []

    def call_in_flight() -> None:  # sent before the silence is known, answered never
        t0 = time.monotonic()
        try:
            client.settings()
        except BaseException as e:  # noqa: BLE001 - checked below
            waiting.append(e)
        waiting.append(time.monotonic() - t0)

    caller = threading.Thread(target=call_in_flight)
    caller.start()
    took = wait_for(lambda: client.status().state == "not_responding", 4.0)
    assert 1.0 < took < 3.5  # the default: 2 s without a heartbeat (sent every 0.5 s)
    caller.join(2.0)
    assert isinstance(waiting[0], EngineNotResponding) and waiting[1] < 3.5
    status = client.status()
    assert "has sent nothing for" in status.reason and "not even its heartbeat" in status.reason
    assert client.alive() and not client.responding()
    assert client.death_reason() is None
    for call in (client.stats, client.settings, lambda: client.submit([1, 2], LONG)):
        t0 = time.monotonic()
        with pytest.raises(EngineNotResponding, match="restart\\(\\) kills it"):
            call()
        assert time.monotonic() - t0 < 0.5
    with pytest.raises(TimeoutError):  # EngineNotResponding is a TimeoutError
        list(client.run_benchmark(BenchmarkSpec(num_requests=1)))
    os.kill(stopped, signal.SIGCONT)
    wait_for(client.responding, 3.0)
    assert client.status().state == "alive" and client.stats()["steps"] >= 0


def test_stream_and_result_without_timeout_give_up_on_a_silent_engine(client):
    rid = client.submit([3, 1, 4, 1, 5], LONG)
    it = client.stream(rid)
    got = [next(it)]
    os.kill(client.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(EngineNotResponding):
            for delta in it:
                got.append(delta)
        assert time.monotonic() - t0 < 6.0  # give_up_after_s=4 plus what was queued
        with pytest.raises(EngineNotResponding):
            client.result(rid)
    finally:
        os.kill(client.pid, signal.SIGCONT)
    out = client.result(rid, timeout=60)  # the engine resumed: the request finishes
    assert out.finish_reason == "length" and len(out.token_ids) == 400
    assert out.text.startswith("".join(got))


def test_a_submit_that_is_not_confirmed_leaves_nothing_running(client):
    wait_for(lambda: idle(client), 10.0)
    bus = client.telemetry()
    os.kill(client.pid, signal.SIGSTOP)
    try:
        with pytest.raises(EngineNotResponding) as err:
            client.submit([2, 7, 1, 8], LONG)  # sent before the silence is known
    finally:
        os.kill(client.pid, signal.SIGCONT)
    rid = err.value.request_id
    assert rid and f"request {rid} was aborted" in str(err.value)
    out = client.result(rid, timeout=1)
    assert out.finish_reason == "abort" and "was aborted" in out.error

    def ended_by_abort() -> bool:
        return any(
            e.request_id == rid and e.kind == "finished" and e.reason == "abort"
            for e in bus.snapshot_events(500)
        )

    wait_for(ended_by_abort, 10.0)  # the engine read the submit, then the abort after it
    wait_for(lambda: idle(client), 5.0)
    generated = sum(
        e.num_tokens
        for e in bus.snapshot_events(2000)
        if e.request_id == rid and e.kind in ("first_token", "tokens")
    )
    assert generated < 400


def test_abort_is_applied_in_order_and_never_waits(client):
    rid = client.submit([9, 9, 9], LONG)
    next(client.stream(rid, timeout=30))
    os.kill(client.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        client.abort(rid)  # to a stopped engine: returns at once, applies when it resumes
        assert time.monotonic() - t0 < 0.1
    finally:
        os.kill(client.pid, signal.SIGCONT)
    out = client.result(rid, timeout=10)
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < 400
    with pytest.raises(ValueError, match="request_id must be a string"):
        client.abort(["x"])  # type: ignore[arg-type]
    client.abort("never-submitted")  # ignored by the engine
    assert (
        client.generate([1, 2, 3], dict(max_tokens=4, ignore_eos=True), timeout=30).finish_reason
        == "length"
    )


def test_kill_mid_stream_keeps_the_tokens_and_text_that_streamed(client):
    solo = client.generate([5, 6, 7, 8], LONG, timeout=60)
    rid = client.submit([5, 6, 7, 8], LONG)
    streamed = []
    for delta in client.stream(rid, timeout=30):
        streamed.append(delta)
        if len(streamed) == 20:
            break
    os.kill(client.pid, signal.SIGKILL)
    out = client.result(rid, timeout=3)
    assert out.finish_reason == "error" and "SIGKILL" in out.error
    assert len(out.token_ids) >= 20
    assert out.token_ids == solo.token_ids[: len(out.token_ids)]
    assert out.text.startswith("".join(streamed))
    assert solo.text.startswith(out.text)
    client.restart()


def test_restart_and_shutdown_of_a_stopped_engine_are_quick(client):
    rid = client.submit([4, 4, 4], LONG)
    next(client.stream(rid, timeout=30))
    old = client.pid
    os.kill(old, signal.SIGSTOP)
    wait_for(lambda: client.status().state == "not_responding", 4.0)
    t0 = time.monotonic()
    client.restart()
    assert client.pid != old and client.status().state == "alive"
    assert client.result(rid, timeout=1).finish_reason == "error"
    assert (
        client.generate([1, 2, 3], dict(max_tokens=4, ignore_eos=True), timeout=30).finish_reason
        == "length"
    )
    restart_s = time.monotonic() - t0
    os.kill(client.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    client.shutdown()
    assert time.monotonic() - t0 < 6.0  # ~2 s to notice, 1 s grace: not a polite 30 s
    assert client.death_reason() == "the engine was shut down"
    with pytest.raises(EngineDead):
        client.stats()
    client.restart()  # the module's client serves on
    assert restart_s < 120


def test_bad_inputs_through_the_client_never_touch_good_requests(client):
    """The client half of the randomised fault test: while good requests stream and the
    settings switch live, threads send every kind of bad input; each is refused alone and
    every good request's tokens equal its run alone."""
    rng = random.Random(7)
    prompts = [[rng.randrange(1, 250) for _ in range(rng.randrange(2, 30))] for _ in range(12)]
    params = dict(max_tokens=48, temperature=0.0, ignore_eos=True)
    before = client.settings()
    solo = [client.generate(p, params, timeout=60).token_ids for p in prompts]
    busy = client.submit([6, 6, 6], LONG)  # certainly running while the bad inputs come
    next(client.stream(busy, timeout=30))
    good = [client.submit(p, params) for p in prompts]
    bad_inputs = [
        lambda: client.submit([1, 10**6], params),  # token id outside the vocabulary
        lambda: client.submit([1, 2], {"temperature": -1.0}),
        lambda: client.submit([1, 2], {"no_such_param": 1}),
        lambda: client.submit([1, 2], {"top_k": "many"}),
        lambda: client.submit([], params),
        lambda: client.submit(None, params),  # type: ignore[arg-type]
        lambda: client.submit([1, 2], params, request_id=busy),  # in use
        lambda: client.submit([1, 2], params, request_id=""),
        lambda: client.submit([1, 2], params, request_id=5),  # type: ignore[arg-type]
        lambda: client.abort({"x": 1}),  # type: ignore[arg-type]
        lambda: client.abort(["x"]),  # type: ignore[arg-type]
        lambda: client.submit([1, 2], {"stop": [object()]}),  # cannot be pickled
    ]
    refused: list[str] = []
    accepted: list[int] = []
    failures: list[BaseException] = []

    def inject(order: list[int]) -> None:
        for k in order:
            if rng.random() < 0.3:
                client.abort(f"unknown-{k}")  # ignored by the engine
            try:
                bad_inputs[k]()
            except ValueError as e:
                refused.append(str(e))
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)
            else:
                accepted.append(k)

    def switch(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                client.configure(async_batching=rng.random() < 0.5, num_slots=rng.choice([1, 2, 3]))
            except BaseException as e:  # noqa: BLE001
                failures.append(e)
            time.sleep(0.05)

    # Random orders, but the id still in use first: `busy` must not have ended by then (its
    # 400 tokens can end before four slow threads reach the end of their lists).
    in_use = 6
    orders = [[in_use] + rng.sample([k for k in range(len(bad_inputs)) if k != in_use],
                                    len(bad_inputs) - 1) for _ in range(4)]
    stop = threading.Event()
    switcher = threading.Thread(target=switch, args=(stop,))
    switcher.start()
    threads = [threading.Thread(target=inject, args=(o,)) for o in orders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    client.abort(busy)  # its part is over: it was running while the bad inputs came
    try:
        for rid, expected in zip(good, solo, strict=True):
            out = client.result(rid, timeout=60)
            assert out.finish_reason == "length" and out.error is None
            assert out.token_ids == expected
    finally:
        stop.set()
        switcher.join(10)
        client.configure(async_batching=before["async_batching"], num_slots=before["num_slots"])
    assert not failures and not accepted
    assert len(refused) == 4 * len(bad_inputs)
    # Ended by the abort, or, on a slow machine, by its own length first: never cut short by
    # a bad input.
    out = client.result(busy, timeout=10)
    assert out.finish_reason == "abort" or (
        out.finish_reason == "length" and len(out.token_ids) == LONG["max_tokens"]), out
    wait_for(lambda: idle(client), 5.0)
    assert client.stats()["kv_blocks_used"] == 0
