"""Starting a real `python -m engine serve` process and reading its /metrics, for tests/serving.

Starting one takes seconds on a small CPU (the engine process imports torch and loads the
model), so conftest.py shares one server across the session; tests that need a clean state
wait for the engine to go idle (wait_idle).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from engine_procs import engine_pids  # tests/ is on sys.path (conftest.py)
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
MODEL = "models/gapless-tiny-python"
SERVED = "gapless-tiny-python"  # the name it is served under by default: its folder's
API_KEY = "test-key-123"
HEADER_TIMEOUT_S = 3.0  # the session server's --header-timeout
BODY_TIMEOUT_S = 10.0  # a 4 MB body must arrive in time on a loaded CI machine
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
_LISTENING = re.compile(r"gapless: serving .* at (http://[\d.]+:\d+)/v1")


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    socket: Path  # where other local clients (the dashboard) attach to its engine

    def engine_pid(self) -> int:
        """The engine process: the serve process's only one (started by any of its threads:
        a restart starts it from the supervisor's; forked from serve's fork server where
        there is one, tests/engine_procs.py)."""
        pids = engine_pids(self.proc.pid)
        assert len(pids) == 1, f"serve has engine processes {pids}"
        return pids[0]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_server(tmp: Path, *args: str, env: dict[str, str] | None = None,
                 timeout_s: float = 180.0) -> Server:
    log = tmp / "serve.log"
    sock = tmp / "engine" / "engine.sock"
    # config.yaml with the tiny shipped model (the default, SmolLM2, is slower on a CPU): the
    # served model name stays MODEL, as given in the config.
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["model"] = MODEL
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    with log.open("wb") as out:  # a file, not a pipe: a full pipe would stall the server
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--port", "0", "--device", "cpu",
             "--listen", str(sock), "--log-level", "warning", "--config", str(tmp / "config.yaml"),
             *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}: {log.read_text()[-3000:]}")
        if url is None:
            m = _LISTENING.search(log.read_text(errors="replace"))
            url = m.group(1) if m else None
        if url is not None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return Server(proc, url, log, sock)
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"serve did not come up in {timeout_s:g} s: {log.read_text()[-3000:]}")


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client's own parser: (sample name, labels) -> value."""
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples: dict, name: str, default: float | None = None, **labels: str) -> float:
    """One sample's value; labels not given are summed over. A labelled counter has no
    sample until its first count: ``default`` stands in then (None: that is an error)."""
    found = [v for (n, lab), v in samples.items()
             if n == name and all(dict(lab).get(k) == want for k, want in labels.items())]
    if not found and default is not None:
        return default
    assert found, f"{name} {labels} not in /metrics"
    return sum(found)


def wait_idle(url: str, timeout_s: float = 60.0) -> dict:
    """Wait until the engine runs nothing, holds no KV block and generates nothing across
    two scrapes more than a stats period (1 s) apart, so the figures are not ones taken
    before the last request ran; returns the second scrape."""
    deadline = time.monotonic() + timeout_s

    def idle(samples: dict) -> bool:
        return (metric(samples, "vllm:num_requests_running")
                + metric(samples, "vllm:num_requests_waiting")
                + metric(samples, "gapless:kv_blocks_used")) == 0

    first = scrape(url)
    while True:
        time.sleep(1.2)
        second = scrape(url)
        if idle(first) and idle(second) and (
                metric(first, "vllm:generation_tokens_total")
                == metric(second, "vllm:generation_tokens_total")):
            return second
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still busy after {timeout_s:g} s")
        first = second


def wait_scrape(url: str, ready: Callable[[dict], bool], what: str,
                timeout_s: float = 30.0) -> dict:
    """Scrape until ``ready(samples)``: the server reads telemetry every 0.25 s and asks the
    engine for stats every second, so a figure may trail what the client has seen."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        if ready(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"/metrics never showed {what} within {timeout_s:g} s")
        time.sleep(0.1)
