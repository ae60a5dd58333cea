"""The dashboard's HTTP API (ui.http_sidecar: `serve --attach` beside the dashboard's engine)
outlives a long engine death: it says it waits for the engine's owner (it cannot restart the
engine itself), and once the owner restarts the engine the API answers again, with no one
restarting the API. It ends with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import yaml
from serve_process import ROOT

from bench.harness import headless_chromium as headless
from engine.process.client import EngineClient
from ui.http_sidecar import http_api_command, stop_http_api

DEAD_S = 60.0


def _config(tmp_path) -> str:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config.update(model=str(ROOT / "models" / "gapless-tiny-python"), device="cpu")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _wait(url: str, status: int, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"serve --attach exited with {proc.returncode}"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == status:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"/health never answered {status}"
        time.sleep(0.2)


def _complete(url: str) -> httpx.Response:
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    return httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": "import os\n", "max_tokens": 3, "ignore_eos": True})


@pytest.mark.slow  # the engine stays dead for a minute
def test_the_api_comes_back_after_a_long_engine_death_and_a_restart(tmp_path):
    path = _config(tmp_path)
    sock = tmp_path / "engine" / "engine.sock"
    owner = EngineClient(path, listen=sock)  # the dashboard's engine
    port = headless.free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    api = None
    try:
        with log.open("wb") as out:  # the sidecar's output goes to ours: catch it here
            api = subprocess.Popen(http_api_command(sock, path, port), stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   cwd=ROOT)
        _wait(url, 200, 120, api)
        assert _complete(url).status_code == 200
        os.kill(owner.pid, signal.SIGKILL)
        _wait(url, 503, 30, api)
        time.sleep(DEAD_S)  # longer than any number of re-attach tries with backoff
        assert api.poll() is None, "the API gave up on the engine"
        health = httpx.get(f"{url}/health", timeout=10).json()["error"]["message"]
        assert "owner" in health and "restarting it" not in health
        owner.restart()  # the dashboard's Restart
        _wait(url, 200, 60, api)
        r = _complete(url)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        said = log.read_text()
        assert "re-attaching" in said and "re-attached" in said
        assert "restarting it with the same settings" not in said
    finally:
        stop_http_api(api)
        owner.shutdown()


def test_the_api_ends_with_the_process_that_started_it(tmp_path):
    path = _config(tmp_path)
    script = tmp_path / "dashboard.py"
    port = headless.free_port()
    script.write_text(textwrap.dedent(f"""
        import time
        import httpx
        from engine.process.client import EngineClient
        from ui.http_sidecar import start_http_api
        owner = EngineClient({path!r}, listen={str(tmp_path / "e" / "engine.sock")!r})
        api = start_http_api({str(tmp_path / "e" / "engine.sock")!r}, {path!r}, {port})
        while True:  # until the API answers
            try:
                if httpx.get("http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        print("api", api.pid, flush=True)
        time.sleep(300)
    """))
    dashboard = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                 text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = ""
        while not line.startswith("api "):  # once the API answers (its own output comes too)
            line = dashboard.stdout.readline()
            assert line, "the dashboard stand-in ended"
        api_pid = int(line.split()[1])
        dashboard.kill()  # the dashboard dies without a word
        dashboard.wait(10)
        # At once: not after giving up on the engine (its owner took it along) in its time.
        deadline = time.monotonic() + 15
        while True:
            try:
                os.kill(api_pid, 0)
            except ProcessLookupError:
                break
            stat = open(f"/proc/{api_pid}/stat").read().rsplit(")", 1)[1].split()
            if stat[0] == "Z":
                break
            assert time.monotonic() < deadline, "the API outlived the dashboard"
            time.sleep(0.2)
    finally:
        if dashboard.poll() is None:
            dashboard.kill()
