"""The Playground's stream against a real engine process (the tiny shipped model, CPU): a
stream cut mid-reply (what Stop does: the click reruns the page, which raises inside the
stream loop) aborts the request in the engine, whose running count and KV blocks go back;
the partial text stays, and the engine's own end ("abort") is read back onto it. A stopped
engine (SIGSTOP) mid-reply is noticed while the reply waits, and the reply finishes once the
engine resumes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from engine.process.client import EngineClient
from ui.engine_link import engine_status
from ui.widgets.conversation import Reply, follow, interrupt, settings_line, settle

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models" / "gapless-tiny-python"
LONG = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}

pytestmark = pytest.mark.slow


class Rerun(Exception):
    """Stands in for Streamlit's RerunException, raised inside a draw call by a click."""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    config = tmp_path_factory.mktemp("config") / "tiny.yaml"
    settings = yaml.safe_load((REPO / "config.yaml").read_text())
    settings["model"] = str(TINY)
    config.write_text(yaml.safe_dump(settings))
    with EngineClient(config_path=config, call_timeout_s=2.0) as c:
        yield c


def _idle(client: EngineClient, limit_s: float = 30.0) -> dict[str, int]:
    deadline = time.monotonic() + limit_s
    while (stats := client.stats())["running"] or stats["unfinished"] or stats["waiting"]:
        assert time.monotonic() < deadline, f"the engine did not go idle: {stats}"
        time.sleep(0.05)
    return stats


def test_a_cut_stream_aborts_the_request_and_keeps_the_partial_text(client) -> None:
    before = _idle(client)
    reply = Reply("def f(x):", settings_line(LONG), request_id=client.submit("def f(x):", LONG),
                  t_submit=time.perf_counter())
    seen: list[str] = []

    def draw(text: str) -> None:
        seen.append(text)
        if len(seen) == 3:
            raise Rerun  # Stop clicked: the page's run is interrupted here

    with pytest.raises(Rerun):
        try:
            follow(client, reply, draw, lambda silent_s: None)
        finally:
            interrupt(client, reply, "stopped (Stop button)")
    assert reply.state == "cut" and reply.text == seen[-1] and reply.text
    during = client.stats()
    after = _idle(client)
    assert after["kv_blocks_used"] <= before["kv_blocks_used"], (before, during, after)
    settle(client, reply, timeout_s=10.0)
    assert reply.state == "done"
    assert "finished: abort" in reply.figures, reply.figures
    assert reply.cut == "stopped (Stop button)"
    tokens = int(reply.figures.split(" tokens · e2e")[0].rsplit("· ", 1)[1])
    assert 3 <= tokens < LONG["max_tokens"], reply.figures  # cut, not run to its end
    assert reply.text.startswith(seen[-1])


def test_a_stopped_engine_is_noticed_mid_reply_and_the_reply_resumes(client) -> None:
    _idle(client)
    pid = client.pid
    assert pid is not None
    params = {**LONG, "max_tokens": 200}
    reply = Reply("import os", settings_line(params), request_id=client.submit("import os",
                                                                               params))
    states: list[tuple[float, str]] = []
    stopped_at: list[float] = []

    def draw(text: str) -> None:
        if not stopped_at and len(text) > 5:
            os.kill(pid, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

    def waiting(silent_s: float) -> None:
        state = engine_status(client).state
        states.append((time.monotonic(), state))
        if state == "not_responding" and stopped_at:
            os.kill(pid, signal.SIGCONT)  # said once: let it go on

    try:
        follow(client, reply, draw, waiting)
    finally:
        os.kill(pid, signal.SIGCONT)
    hung = [t for t, s in states if s == "not_responding"]
    assert stopped_at and hung, states
    # Noticed while the reply waited, well before the client gives up on the engine (30 s).
    assert hung[0] - stopped_at[0] < client.timeouts.give_up_after_s, (stopped_at, hung)
    out = client.result(reply.request_id, timeout=30)
    assert out.finish_reason == "length" and len(out.token_ids) == params["max_tokens"]
    assert reply.text == out.text  # every delta arrived, none lost over the pause
