"""Every page under AppTest against a stand-in engine: controls, prompts, benchmark, errors.

The stand-in (fake_engine.FakeEngineClient) is swapped in through ui.client.make_client, so
these tests run in a second and can make the engine die or reject a prompt on purpose.
test_pages_engine.py runs the same pages on the real engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st
from fake_engine import FakeEngineClient
from streamlit.testing.v1 import AppTest

import ui.client

APP = Path(__file__).resolve().parents[2] / "app.py"
TIMEOUT = 30


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngineClient]:
    client = FakeEngineClient()
    st.cache_resource.clear()
    monkeypatch.setattr(ui.client, "make_client", lambda: client)
    yield client
    st.cache_resource.clear()


def app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=TIMEOUT)


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [e.value for e in at.error]
    parts += [i.value for i in at.info] + [c.value for c in at.caption]
    return "\n".join(str(p) for p in parts)


def test_live_page_shows_mode_timeline_gauges_and_controls(fake: FakeEngineClient) -> None:
    at = app().run()
    assert not at.exception
    assert at.title[0].value == "Live"
    assert "mode **async**" in texts(at)
    charts = at.get("plotly_chart")
    assert len(charts) == 2  # gauges and timeline
    assert "compute" in charts[1].proto.spec and "cpu.prepare" in charts[1].proto.spec
    assert at.toggle(key="ctl.async").value is True
    assert at.toggle(key="ctl.graphs").disabled  # no GPU
    assert "No GPU" in texts(at)


def test_async_toggle_and_slots_change_the_engines_mode(fake: FakeEngineClient) -> None:
    at = app().run()
    at.toggle(key="ctl.async").set_value(False).run()
    assert fake.settings()["async_batching"] is False
    assert "mode **sync**" in texts(at)
    at.button_group(key="ctl.slots").set_value(3).run()
    assert fake.settings()["num_slots"] == 3
    assert not at.exception


def test_widgets_follow_the_engine_when_another_tab_changes_it(fake: FakeEngineClient) -> None:
    at = app().run()
    fake.configure(async_batching=False, num_slots=1)
    at.run()
    assert at.toggle(key="ctl.async").value is False
    assert at.button_group(key="ctl.slots").value == 1


def test_load_generator_starts_and_stops(fake: FakeEngineClient) -> None:
    at = app().run()
    at.number_input(key="load.concurrency").set_value(4)
    at.button(key="load.start").click().run()
    assert fake.load_running()
    assert fake.load_spec.concurrency == 4 and fake.load_spec.rate is None
    at.button(key="load.stop").click().run()
    assert not fake.load_running()


def test_pause_freezes_the_timeline_and_offers_its_trace(fake: FakeEngineClient) -> None:
    at = app().run()
    at.button(key="live.trace_pause").click().run()
    assert at.toggle(key="live.pause").value is True
    spec = at.get("plotly_chart")[1].proto.spec
    assert "Paused" in spec
    fake.publish_steps(50)
    at.run()
    assert at.get("plotly_chart")[1].proto.spec == spec  # nothing new drawn while paused
    download = at.get("download_button")[0]
    assert not download.proto.disabled
    assert download.proto.url  # a file is registered, not built on click
    at.toggle(key="live.pause").set_value(False).run()
    assert "Live" in at.get("plotly_chart")[1].proto.spec
    assert not at.get("download_button")


def test_dead_engine_shows_a_message_and_restart_brings_it_back(fake: FakeEngineClient) -> None:
    at = app().run()
    fake.kill("engine process exited with code -9 (SIGKILL)")
    at.run()
    assert not at.exception
    assert "SIGKILL" in at.error[0].value
    at.button(key="ui.restart").click().run()
    assert fake.alive()
    assert at.title[0].value == "Live" and not at.error


def test_failed_restart_is_a_message_not_a_traceback(fake: FakeEngineClient) -> None:
    at = app().run()
    fake.kill()
    fake.restart_fails = True
    at.run()
    at.button(key="ui.restart").click().run()
    assert not at.exception
    assert any("model folder missing" in e.value for e in at.error)


def test_engine_that_cannot_start_is_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> FakeEngineClient:
        raise ValueError("config file 'config.yaml' does not exist")

    st.cache_resource.clear()
    monkeypatch.setattr(ui.client, "make_client", broken)
    at = app().run()
    assert not at.exception
    assert "could not start" in at.error[0].value and "config.yaml" in at.error[0].value


def test_graphs_toggle_is_enabled_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeEngineClient(graphs_available=True)
    st.cache_resource.clear()
    monkeypatch.setattr(ui.client, "make_client", lambda: client)
    at = app().run()
    graphs = at.toggle(key="ctl.graphs")
    assert not graphs.disabled
    graphs.set_value(True).run()
    assert client.settings()["cuda_graphs"] is True
    assert "No GPU" not in texts(at)
    st.cache_resource.clear()


def test_playground_prompt_gets_an_answer_with_figures(fake: FakeEngineClient) -> None:
    at = app()
    at.run()
    at.switch_page("pages/playground.py").run()
    at.chat_input(key="play.prompt").set_value("def add").run()
    assert not at.exception
    assert fake.submitted[-1][0] == "def add"
    assert any("return a + b" in c.value for c in at.code)
    assert any("TTFT" in c.value and "tokens/s" in c.value for c in at.caption)
    params = fake.submitted[-1][1]
    assert params is not None and params["max_tokens"] == 64


def test_playground_rejected_prompt_shows_the_engines_message(fake: FakeEngineClient) -> None:
    at = app()
    at.run()
    at.switch_page("pages/playground.py").run()
    at.chat_input(key="play.prompt").set_value("x" * 3000).run()
    assert not at.exception
    assert "max_model_len" in at.error[0].value


def test_benchmark_page_runs_every_mode_and_compares(fake: FakeEngineClient) -> None:
    at = app()
    at.run()
    at.switch_page("pages/benchmark.py").run()
    at.button(key="bench.run").click().run()
    assert not at.exception
    table = at.dataframe[0].value
    assert list(table["mode"]) == ["sync", "async"]
    assert len(at.get("plotly_chart")) == 2  # one timeline per mode


def test_requests_page_lists_requests_with_latencies(fake: FakeEngineClient) -> None:
    for _ in range(3):
        rid = fake.submit("def f")
        list(fake.stream(rid))
    at = app()
    at.run()
    at.switch_page("pages/requests.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert len(table) == 3
    assert set(table["status"]) == {"length"}
    assert (table["TTFT ms"] > 0).all()
    assert len(at.get("plotly_chart")) == 1
