"""EngineClient runs the engine in its own process: same greedy output as in-process, the
engine's validation messages, live settings, mirrored telemetry, the load generator and the
benchmark across the pipe, and engine death noticed fast with nothing left hanging. The
engine process also exits when its parent dies, and never imports streamlit.

Each engine process costs ~10 s to start on a 2-core CPU (torch + transformers imports), so
one client serves most tests; the death test restarts it and runs last.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from engine_procs import engine_pids, parent_of, process_gone  # tests/ is on sys.path (conftest.py)

from engine import Engine, EngineConfig, SamplingParams
from engine.drivers.loadgen import LoadSpec
from engine.drivers.workload import BenchmarkProgress, BenchmarkResult, BenchmarkSpec
from engine.process.client import (
    EngineClient,
    EngineDead,
    EngineStartError,
    exit_reason,
    last_words,
)
from engine.process.wire import decode_events, decode_steps, encode_events, encode_steps
from telemetry.records import LANES, RequestEvent, Span, StepRecord

SMALL = dict(
    device="cpu", max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512, block_size=16
)
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> Path:
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def client(model_dir):
    c = EngineClient(None, model=str(model_dir), **SMALL)
    yield c
    c.shutdown()


class OnlyHere:
    """A class the engine process cannot import."""


def wait_for(predicate, timeout: float, step: float = 0.01) -> float:
    """Seconds until predicate() held; fails the test after ``timeout``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - t0


def test_stream_and_result_equal_the_in_process_engine(client, model_dir):
    prompts: list = [[5, 17, 42, 99, 3], [7] * 20, "def add(a, b):"]
    with Engine(EngineConfig(model=str(model_dir), **SMALL)) as eng:
        expected = eng.generate(prompts, SamplingParams(**GREEDY))
    rids = [client.submit(p, GREEDY) for p in prompts]
    for rid, exp in zip(rids, expected, strict=True):
        text = "".join(client.stream(rid, timeout=30))
        out = client.result(rid, timeout=30)
        assert out.token_ids == exp.token_ids
        assert out.prompt_token_ids == exp.prompt_token_ids
        assert text == out.text == exp.text
        assert out.finish_reason == "length" and out.error is None
        assert out.metrics["e2e_s"] > 0


def test_bad_input_raises_the_engines_message_and_the_next_request_succeeds(client, model_dir):
    vocab = client.settings()  # the engine is alive and answering
    with Engine(EngineConfig(model=str(model_dir), **SMALL), start=False) as eng:
        with pytest.raises(ValueError) as local:
            eng.submit([1, 10**6], GREEDY)
    with pytest.raises(ValueError) as remote:
        client.submit([1, 10**6], GREEDY)
    assert str(remote.value) == str(local.value)
    assert "outside the vocabulary" in str(remote.value)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        client.submit([1, 2], {"temperature": -1.0})
    with pytest.raises(ValueError, match="unknown sampling parameter 'max_new_tokens'"):
        client.submit([1, 2], {"max_new_tokens": 3})
    with pytest.raises(ValueError, match="prompt is empty"):
        client.submit("", None)
    with pytest.raises(ValueError, match="cannot send 'submit' to the engine process"):
        client.submit([1, 2], {"stop": [lambda: 0]})  # cannot be pickled
    with pytest.raises(ValueError, match="engine process cannot read the arguments of submit"):
        client.submit([1, 2], OnlyHere())  # this test module is not importable there
    out = client.generate([1, 2, 3], GREEDY, timeout=30)
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert vocab == client.settings()


def test_configure_round_trips(client):
    before = client.settings()
    try:
        after = client.configure(async_batching=not before["async_batching"], num_slots=3)
        assert after["async_batching"] is (not before["async_batching"])
        assert after["num_slots"] == 3
        assert client.settings() == after
        with pytest.raises(ValueError, match="num_slots must be one of 1, 2, 3, got 5"):
            client.configure(num_slots=5)
        with pytest.raises(ValueError, match="cuda_graphs cannot be turned on"):
            client.configure(cuda_graphs=True)
        assert client.settings() == after
        assert client.generate([4, 5, 6], GREEDY, timeout=30).finish_reason == "length"
    finally:
        client.configure(async_batching=before["async_batching"], num_slots=before["num_slots"])
    stats = client.stats()
    assert stats["steps"] > 0 and stats["generated_tokens"] > 0
    assert stats["kv_blocks_total"] > 0


def test_configure_is_a_compare_and_set_on_the_settings_version(client):
    """A change carrying the version it was made on applies once; the same change sent
    again (or any change made on that older view) is refused and changes nothing."""
    before = client.settings()
    v = before["settings_version"]
    try:
        after = client.configure(num_slots=1 if before["num_slots"] != 1 else 3,
                                 expect_version=v, origin="tab test")
        assert "refused" not in after and after["settings_version"] == v + 1
        again = client.configure(num_slots=2, expect_version=v, origin="tab test")
        assert "version" in again["refused"]
        assert client.settings()["num_slots"] == after["num_slots"]
        assert client.settings()["settings_version"] == v + 1
        same = client.configure(num_slots=after["num_slots"], expect_version=v + 1)
        assert same["settings_version"] == v + 1  # no change: no new version
        assert client.settings()["engine_pid"] == client.pid
        on = client.configure(sentinel_sample_every=4, origin="tab test")  # the dashboard's
        assert on["sentinel_sample_every"] == 4 and on["settings_version"] == v + 2
    finally:
        client.configure(num_slots=before["num_slots"], sentinel_sample_every=0)


def test_telemetry_arrives_in_the_client_mirror(client):
    rid = client.submit([9, 8, 7, 6], GREEDY)
    client.result(rid, timeout=30)
    bus = client.telemetry()

    def finished_seen() -> bool:
        return any(e.request_id == rid and e.kind == "finished" for e in bus.snapshot_events(200))

    wait_for(finished_seen, 2.0)
    kinds = {e.kind for e in bus.snapshot_events(200) if e.request_id == rid}
    assert {"queued", "first_token", "finished"} <= kinds
    steps = bus.snapshot_steps(50)
    assert steps and all(r.spans for r in steps)
    assert any(s.lane == "compute" for r in steps for s in r.spans)
    # One clock on both sides: the engine's stamps are recent in this process's clock.
    assert 0 < time.perf_counter_ns() - steps[-1].spans[-1].end_ns < 60e9


def test_the_engine_process_does_not_import_streamlit_or_ui(client):
    info = client.process_info()
    assert info["pid"] == client.pid and client.pid in engine_pids(os.getpid())
    # Ours: our child, or our fork server's (engine/process/forkserver.py, no GPU here).
    assert info["parent_pid"] == os.getpid() or (
        os.getpid() == parent_of(info["parent_pid"]) and not torch.cuda.is_available())
    assert info["streamlit_imported"] is False and info["ui_imported"] is False
    if not torch.cuda.is_available():  # a GPU machine has NVML: then there is a reading
        assert client.nvml() is None and client.nvml_reason().startswith("no GPU")


def test_load_generator_runs_in_the_engine_process_and_stops(client):
    client.start_load(LoadSpec(concurrency=3, prompt_len=8, max_tokens=16))
    try:
        assert client.load_running()
        wait_for(lambda: client.load_stats()["finished"] >= 3, 10.0, 0.05)
        seen = [client.stats() for _ in range(20)]
        assert max(s["running"] + s["waiting"] for s in seen) <= 3
        with pytest.raises(ValueError, match="load generator is running"):
            list(client.run_benchmark(BenchmarkSpec(num_requests=2, prompt_len=4, max_tokens=4)))
    finally:
        stats = client.stop_load()
    assert not client.load_running() and not stats["running"]
    assert stats["spec"]["concurrency"] == 3
    wait_for(lambda: client.stats()["running"] == 0, 3.0, 0.02)
    with pytest.raises(ValueError, match="exactly one of concurrency or rate"):
        LoadSpec(concurrency=4, rate=2.0)


def test_benchmark_through_the_client(client):
    before = client.settings()
    items, running = [], []
    for item in client.run_benchmark(BenchmarkSpec(num_requests=3, prompt_len=8, max_tokens=8)):
        items.append(item)
        if len(items) == 1:  # every client's settings say a benchmark runs (banner)
            running.append(client.settings()["benchmark_running"])
    assert running == [True] and before["benchmark_running"] is False
    results = [i for i in items if isinstance(i, BenchmarkResult)]
    assert [r.mode_label for r in results] == ["sync", "async"]
    assert all(r.tokens_per_s > 0 and r.records and r.num_steps > 0 for r in results)
    assert any(isinstance(i, BenchmarkProgress) and i.done == 3 for i in items)
    after = client.settings()
    # The benchmark's mode switches are changes too: a view drawn before it is stale after.
    assert after.pop("settings_version") > before.pop("settings_version")
    assert after == before
    with pytest.raises(ValueError, match="num_requests must be an integer >= 1"):
        list(client.run_benchmark(BenchmarkSpec(num_requests=0)))


def test_telemetry_wire_format_round_trips():
    spans = [Span(lane, 10 * k, 10 * k + 5) for k, lane in enumerate(LANES)]
    steps = [StepRecord(3, "async", 1, 2, 5, 2, 3, 8, spans, 2, 1, 4, 64, 1),
             StepRecord(4, "sync", 0, 1, 0, 1)]
    events = [RequestEvent("r", "finished", 99, 0, 7, "length"), RequestEvent("q", "queued", 1)]
    wire = pickle.loads(pickle.dumps((encode_steps(steps), encode_events(events))))
    assert decode_steps(wire[0]) == steps and decode_events(wire[1]) == events


def test_exit_reasons_read_well():
    assert exit_reason(-9) == "engine process exited with code -9 (SIGKILL)"
    assert exit_reason(-9, "Loading weights: 100%") == exit_reason(-9)
    assert exit_reason(1, "RuntimeError: CUDA error: out of memory") == (
        "engine process exited with code 1; its last output: RuntimeError: CUDA error: out "
        "of memory")
    assert exit_reason(0, "bye") == "engine process exited with code 0"
    assert last_words(["x", "Fatal Python error: Aborted", "  File a.py, line 3"]) == (
        "Fatal Python error: Aborted")
    assert last_words(["just", "lines"]) == "lines" and last_words([]) is None


def test_bad_config_is_refused_before_any_process_starts():
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1"):
        EngineClient(None, max_num_seqs=0)
    with pytest.raises(ValueError, match="unknown engine setting 'max_seqs'"):
        EngineClient(None, max_seqs=4)


def test_a_missing_model_is_reported_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = tmp_path / "no-such-model"
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as err:
        EngineClient(None, model=str(missing), device="cpu", start_timeout_s=60)
    assert f"could not load model {str(missing)!r}" in str(err.value)
    assert isinstance(err.value, EngineDead)
    assert time.monotonic() - t0 < 60


def test_the_engine_exits_when_its_parent_dies(model_dir, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, sys, time
        import streamlit  # under multiprocessing's spawn the engine would import it too
        from engine.process.client import EngineClient
        c = EngineClient(None, model={str(model_dir)!r}, device="cpu", max_num_seqs=2,
                         max_num_batched_tokens=32, max_model_len=64)
        info = c.process_info()
        print(json.dumps({{"pid": c.pid, "streamlit": info["streamlit_imported"]}}), flush=True)
        time.sleep(120)
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(parent.stdout.readline()))
        reader.start()
        reader.join(90)
        assert line and line[0], "the parent never reported its engine's pid"
        info = json.loads(line[0])
        engine_pid = info["pid"]
        assert info["streamlit"] is False, "the engine process imported streamlit"
        assert not process_gone(engine_pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(5)
        waited = wait_for(lambda: process_gone(engine_pid), 5.0, 0.05)
        assert waited < 5.0
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)


def test_killed_engine_is_reported_and_restart_serves_again(client):
    long = dict(max_tokens=480, temperature=0.0, ignore_eos=True)
    rids = [client.submit([3, 1, 4, 1, 5], long) for _ in range(2)]
    rids.append(client.submit("def f(x):", long))  # text: tokenized in the engine process
    first = next(client.stream(rids[0], timeout=30))  # running, not just queued
    assert isinstance(first, str)
    streamed: dict[str, list[str]] = {}

    def drain(rid: str) -> None:
        streamed[rid] = list(client.stream(rid, timeout=10))

    drains = [threading.Thread(target=drain, args=(r,)) for r in rids[1:]]
    for t in drains:
        t.start()
    pid = client.pid
    os.kill(pid, signal.SIGKILL)
    took = wait_for(lambda: not client.alive(), 2.0)
    assert took < 2.0
    reason = client.death_reason()
    assert reason == "engine process exited with code -9 (SIGKILL)"
    for rid in rids:
        out = client.result(rid, timeout=2)
        assert out.finish_reason == "error"
        assert out.error == reason
        assert out.prompt_token_ids, f"{rid}: the ended request lost its prompt"
    assert client.result(rids[0], timeout=2).prompt_token_ids == [3, 1, 4, 1, 5]
    for t in drains:
        t.join(2)
        assert not t.is_alive(), "a stream() iterator hung after the engine died"
    with pytest.raises(EngineDead, match="SIGKILL"):
        client.submit([1, 2], GREEDY)
    with pytest.raises(EngineDead):
        client.stats()
    with pytest.raises(EngineDead):
        list(client.run_benchmark(BenchmarkSpec(num_requests=1)))
    client.restart()
    assert client.alive() and client.death_reason() is None
    assert client.pid != pid
    out = client.generate([1, 2, 3], GREEDY, timeout=30)
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    # A crash says what the process printed on its way out (faulthandler in the child).
    os.kill(client.pid, signal.SIGSEGV)
    wait_for(lambda: not client.alive(), 2.0)
    assert client.death_reason() == ("engine process exited with code -11 (SIGSEGV); its last "
                                     "output: Fatal Python error: Segmentation fault")
    client.restart()
    assert client.generate([1, 2, 3], GREEDY, timeout=30).token_ids == out.token_ids
    client.shutdown()
    client.shutdown()  # idempotent
    assert not client.alive() and client.death_reason() == "the engine was shut down"
    wait_for(lambda: process_gone(client.pid), 5.0)
    with pytest.raises(EngineDead, match="shut down"):
        client.settings()
