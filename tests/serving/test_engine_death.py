"""A server on a model without a chat template, whose engine process is then killed: chat
says why it cannot answer, and after the kill every endpoint answers 503 with the reason
(a stream in flight ends with an error event) while the HTTP server itself keeps running.
Its own server process, since it kills the engine."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from serve_process import MODEL, metric, scrape, start_server


@pytest.fixture(scope="module")
def doomed(tmp_path_factory: pytest.TempPathFactory):
    # No key, no chat template; the server stays up answering 503 after the death.
    srv = start_server(tmp_path_factory.mktemp("doomed"), "--on-engine-death", "stay")
    yield srv
    srv.stop()


def test_chat_without_a_template_says_so(doomed):
    r = httpx.post(f"{doomed.url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "has no chat template" in msg and "/v1/completions" in msg and "--chat-template" in msg
    # Completions work on the same server, without a key (none was set).
    r = httpx.post(f"{doomed.url}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                   timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_dead_engine_gives_503_with_its_reason(doomed):
    body = {"model": MODEL, "prompt": "def main():", "max_tokens": 1000, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    events = []
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{doomed.url}/v1/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                if len(events) == 3:
                    os.kill(doomed.engine_pid(), signal.SIGKILL)
    # The stream ended with an error event naming the death, then [DONE].
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "SIGKILL" in error["message"] and error["code"] == "engine_dead"

    deadline = time.monotonic() + 30
    while httpx.get(f"{doomed.url}/health", timeout=30).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    health = httpx.get(f"{doomed.url}/health", timeout=30).json()["error"]
    assert "engine process exited with code -9 (SIGKILL)" in health["message"]
    r = httpx.post(f"{doomed.url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 503
    assert "the engine is not running" in r.json()["error"]["message"]
    # Validation still answers first, and the server itself is alive.
    r = httpx.post(f"{doomed.url}/v1/completions", json={"prompt": ""}, timeout=30)
    assert r.status_code == 400
    assert doomed.proc.poll() is None
    deadline = time.monotonic() + 30
    while metric(scrape(doomed.url), "gapless:engine_up") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
