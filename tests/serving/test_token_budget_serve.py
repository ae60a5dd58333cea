"""`python -m engine serve` keeps a live token budget across an engine death: a client
attached to serve's engine (the dashboard, say) sets it, /metrics shows it, the engine is
killed, and serve's restart puts it back (a bare restart would start at config.yaml's)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
from serve_process import metric, start_server, wait_scrape

from engine.process.client import EngineClient

BUDGET = 64  # config.yaml's is 512, its max_num_seqs 16


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    srv = start_server(tmp_path_factory.mktemp("budget"), "--on-engine-death", "restart")
    yield srv
    srv.stop()


def test_serve_puts_the_budget_back_after_the_engine_dies(served):
    wait_scrape(served.url, lambda s: metric(s, "gapless:max_num_batched_tokens") == 512,
                "config.yaml's budget")
    client = EngineClient.attach(served.socket)
    try:
        with pytest.raises(ValueError, match="from 16 to 512 while the engine runs"):
            client.configure(max_num_batched_tokens=1024)
        assert client.configure(max_num_batched_tokens=BUDGET,
                                origin="a test")["max_num_batched_tokens"] == BUDGET
    finally:
        client.shutdown()  # detaches; the engine runs on
    wait_scrape(served.url, lambda s: metric(s, "gapless:max_num_batched_tokens") == BUDGET,
                "the new budget")
    # serve reads what a restart keeps once a second (engine/serving/supervise.py): a change
    # made less than that before a death is not kept. Give it several periods.
    time.sleep(5.0)
    old = served.engine_pid()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while True:  # a new engine process, answering
        try:
            pid = served.engine_pid()
        except (AssertionError, OSError):
            pid = old
        if pid != old and httpx.get(f"{served.url}/health", timeout=30).status_code == 200:
            break
        assert time.monotonic() < deadline, served.output()[-2000:]
        time.sleep(0.2)
    wait_scrape(served.url, lambda s: metric(s, "gapless:engine_up") == 1
                and metric(s, "gapless:max_num_batched_tokens") == BUDGET,
                "the restarted engine at the kept budget")
    assert "the engine runs again" in served.output()
