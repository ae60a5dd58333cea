"""An engine that goes silent (SIGSTOP) and then dies, behind a real `serve`.

While it is stopped: /health and /ready answer 503 with the reason; a client waiting for a
whole answer gets 503 (not 500) once --engine-timeout passes, and a stream gets an error event
then [DONE]; their requests are aborted in the engine, so after SIGCONT they do not run on
(no KV blocks held, far fewer tokens generated than asked). Then the engine is killed and
serve (--on-engine-death restart) starts a new one with the same settings, and says so; across
a death and a restart every counter of /metrics only grows, and the request the death ended
counts as failed with reason engine_dead. Messages speak HTTP, not the Python API. Its own
server process, since it stops and kills the engine."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest
from serve_process import MODEL, metric, start_server, wait_idle, wait_scrape

ENGINE_TIMEOUT_S = 3.0
ASKED = 400  # tokens each request asks for: far more than run before the stop


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("hung"), "--engine-timeout",
                       str(ENGINE_TIMEOUT_S), "--on-engine-death", "restart")
    yield srv
    try:
        os.kill(srv.engine_pid(), signal.SIGCONT)  # never leave it stopped
    except (AssertionError, OSError):
        pass
    srv.stop()


def _body(stream: bool) -> dict:
    return {"model": MODEL, "prompt": "def main():", "max_tokens": ASKED, "temperature": 0.0,
            "ignore_eos": True, "stream": stream}


def _wait_status(url: str, path: str, status: int, timeout_s: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{url}{path}", timeout=30)
        if r.status_code == status:
            return r
        assert time.monotonic() < deadline, f"{path} still {r.status_code}: {r.text}"
        time.sleep(0.1)


def test_silent_engine_fails_its_clients_cleanly_and_aborts_their_requests(hung):
    before = wait_idle(hung.url)
    pid = hung.engine_pid()
    whole: dict = {}

    def wait_whole() -> None:
        r = httpx.post(f"{hung.url}/v1/completions", json=_body(False), timeout=120)
        whole["status"], whole["body"], whole["t"] = r.status_code, r.json(), time.monotonic()

    events: list[str] = []
    stopped_at: list[float] = []
    try:
        with httpx.Client(timeout=120) as http:
            waiter = threading.Thread(target=wait_whole)
            waiter.start()
            # The whole request is in the engine before the stream starts: sent after the
            # stop, it would be refused as a new request (503 at once, after the heartbeat's
            # 2 s), not timed out as one in flight.
            wait_scrape(hung.url, lambda s: metric(s, "vllm:num_requests_running")
                        + metric(s, "vllm:num_requests_waiting") >= 1, "the whole request")
            with http.stream("POST", f"{hung.url}/v1/completions", json=_body(True)) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                    if len(events) == 3 and not stopped_at:
                        os.kill(pid, signal.SIGSTOP)
                        stopped_at.append(time.monotonic())
                        # While stopped: health and readiness say so, with the reason.
                        health = _wait_status(hung.url, "/health", 503).json()["error"]
                        assert health["code"] == "engine_not_responding"
                        assert "not responding" in health["message"]
                        assert "restart()" not in health["message"]  # HTTP speaks HTTP
                        assert _wait_status(hung.url, "/ready", 503).status_code == 503
                        # A new request is refused at once, not queued behind the hang.
                        t0 = time.monotonic()
                        new = httpx.post(f"{hung.url}/v1/completions", timeout=30,
                                         json={"model": MODEL, "prompt": "x", "max_tokens": 1})
                        assert new.status_code == 503 and time.monotonic() - t0 < 5
            waiter.join(120)
        # The stream: an error event, then [DONE].
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "engine_timeout" and "aborted" in error["message"]
        assert "restart()" not in error["message"]
        # The whole answer: 503, not 500, once the engine timeout passed.
        assert whole["status"] == 503, whole
        assert whole["body"]["error"]["code"] == "engine_timeout"
        assert "restart()" not in whole["body"]["error"]["message"]
        # It gave up only after the timeout's silence. The silence is read from the server's
        # own count (in the message), not from this client's SIGSTOP: on a loaded machine
        # the engine can fall silent before the stop (descheduled), so the answer may come
        # less than the timeout after the stop while the silence it waited out is whole.
        silent = float(re.search(r"sent nothing for ([0-9.]+) s",  # type: ignore[union-attr]
                                 whole["body"]["error"]["message"]).group(1))
        assert silent >= ENGINE_TIMEOUT_S, whole["body"]
        assert whole["t"] > stopped_at[0]
    finally:  # never leave it stopped for the next test, whatever failed above
        if stopped_at:
            os.kill(pid, signal.SIGCONT)
    _wait_status(hung.url, "/health", 200)
    # /metrics leaves the engine's gauges out while it does not answer: wait for them.
    wait_scrape(hung.url, lambda s: any(n == "vllm:num_requests_running" for n, _ in s),
                "the engine's gauges again")
    after = wait_idle(hung.url)  # nothing runs on, no KV block is held
    generated = (metric(after, "vllm:generation_tokens_total")
                 - metric(before, "vllm:generation_tokens_total"))
    assert generated < ASKED, f"{generated} tokens generated after the clients were failed"
    aborted = (metric(after, "gapless:requests_aborted_total", default=0.0)
               - metric(before, "gapless:requests_aborted_total", default=0.0))
    assert aborted >= 2


def test_dead_engine_is_restarted_with_the_same_settings(hung):
    old = hung.engine_pid()
    os.kill(old, signal.SIGKILL)
    # While it restarts, /health says so (the new engine takes seconds to load).
    health = _wait_status(hung.url, "/health", 503).json()["error"]
    assert health["code"] == "engine_dead" and "SIGKILL" in health["message"]
    deadline = time.monotonic() + 30
    while "restarting it: attempt 1 of 5" not in health["message"]:
        assert time.monotonic() < deadline, health
        time.sleep(0.05)
        r = httpx.get(f"{hung.url}/health", timeout=30)
        assert r.status_code == 503, "restarted before /health was seen saying so"
        health = r.json()["error"]
    deadline = time.monotonic() + 120
    while True:  # a new engine process, answering
        try:
            pid = hung.engine_pid()
        except (AssertionError, OSError):
            pid = old
        if pid != old and httpx.get(f"{hung.url}/health", timeout=30).status_code == 200:
            break
        assert time.monotonic() < deadline, hung.output()[-2000:]
        time.sleep(0.2)
    r = httpx.post(f"{hung.url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": "def f():", "max_tokens": 2})
    assert r.status_code == 200, r.text
    log = hung.output()
    assert "restarting it with the same settings" in log and "(--on-engine-death restart)" in log
    assert "the engine runs again" in log
    assert hung.proc.poll() is None
    wait_scrape(hung.url, lambda s: metric(s, "gapless:engine_up") == 1, "engine_up 1")


def test_dead_engine_makes_serve_exit_when_asked(tmp_path):
    srv = start_server(tmp_path, "--on-engine-death", "exit")
    try:
        os.kill(srv.engine_pid(), signal.SIGKILL)
        code = srv.proc.wait(60)
        assert code == 3
        log = srv.output()
        assert "exiting with code 3 (--on-engine-death exit)" in log
        assert "SIGKILL" in log
    finally:
        srv.stop()


def _counters(samples: dict) -> dict:
    """Every counter and histogram series: monotonic for the life of the serve process."""
    return {k: v for k, v in samples.items()
            if k[0].endswith(("_total", "_count", "_sum", "_bucket"))}


def test_counters_stay_monotonic_across_an_engine_death_and_restart(hung):
    r = httpx.post(f"{hung.url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "import os", "max_tokens": 20, "ignore_eos": True})
    assert r.status_code == 200, r.text
    before = wait_idle(hung.url)
    old = hung.engine_pid()
    events = []
    with httpx.Client(timeout=120) as http:  # a stream the death ends
        with http.stream("POST", f"{hung.url}/v1/completions", json=_body(True)) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 3:
                    os.kill(old, signal.SIGKILL)
    assert events[-1] == "data: [DONE]" and "engine_dead" in events[-2]
    deadline = time.monotonic() + 120
    while True:  # restarted by serve
        try:
            pid = hung.engine_pid()
        except (AssertionError, OSError):
            pid = old
        if pid != old and httpx.get(f"{hung.url}/health", timeout=30).status_code == 200:
            break
        assert time.monotonic() < deadline, hung.output()[-2000:]
        time.sleep(0.2)
    after = wait_scrape(hung.url, lambda s: metric(s, "gapless:engine_up") == 1 and any(
        n == "vllm:generation_tokens_total" for n, _ in s), "the new engine's counters")
    # No counter went down, and the request the death ended is counted, with its reason.
    went_down = {k: (v, after.get(k)) for k, v in _counters(before).items()
                 if after.get(k, -1.0) < v}
    dead = (metric(after, "gapless:requests_failed_total", 0.0, reason="engine_dead")
            - metric(before, "gapless:requests_failed_total", 0.0, reason="engine_dead"))
    assert not went_down and dead >= 1, (went_down, dead)
    # The new engine's tokens count on top of the old one's.
    tokens = metric(after, "vllm:generation_tokens_total")
    r = httpx.post(f"{hung.url}/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": "x = ", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200, r.text
    wait_scrape(hung.url, lambda s: metric(s, "vllm:generation_tokens_total") >= tokens + 5,
                "5 more generated tokens")
