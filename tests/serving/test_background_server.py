"""The HTTP app on a thread of a process that holds the client (BackgroundServer), on a
stand-in client: it serves, maps each kind of engine failure to its status, streams what
the engine streams, and stops, freeing its port. No model: the engine's side is faked, the
real one is tested against `serve` in the other files."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from fake_serving_client import FakeClient, FakeTokenizer  # tests/serving is on sys.path

from engine.process.client import EngineDead, EngineError
from engine.serving.serve import BackgroundServer


@pytest.fixture(scope="module")
def background():
    client = FakeClient()
    srv = BackgroundServer(client, port=0, tokenizer=FakeTokenizer())
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{srv.url}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the background server never answered"
            time.sleep(0.05)
    yield srv, client
    srv.stop()


def test_it_answers_and_streams(background):
    srv, _ = background
    r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "abc"}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert body["choices"][0]["text"] == "hello"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    with httpx.stream("POST", f"{srv.url}/v1/completions", timeout=30,
                      json={"prompt": "abc", "stream": True}) as r:
        lines = [ln[len("data: "):] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln) for ln in lines[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "hello"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("failure,status,words", [
    (ValueError("prompt token id 300 is outside the vocabulary"), 400, "outside the vocabulary"),
    (EngineDead("engine process exited with code -9 (SIGKILL)"), 503, "SIGKILL"),
    (TimeoutError("the engine did not answer submit within 60 s"), 503, "did not answer"),
    (EngineError("RuntimeError: boom"), 500, "boom"),
])
def test_engine_failures_map_to_statuses(background, failure, status, words):
    srv, client = background
    client.fail = failure
    try:
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": "abc"}, timeout=30)
    finally:
        client.fail = None
    assert r.status_code == status
    assert words in r.json()["error"]["message"]


def test_metrics_come_from_the_client(background):
    srv, _ = background
    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    # vLLM's labels: the engine index and the served model name
    assert re.search(r'vllm:num_requests_running\{[^}]*model_name="fake"[^}]*\} 0\.0', text), text
    assert "gapless:kv_blocks_total 4.0" in text


def test_stop_frees_the_port():
    srv = BackgroundServer(FakeClient(), port=0, tokenizer=FakeTokenizer())
    url = srv.url
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/health", timeout=5)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    srv.stop()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/health", timeout=5)
