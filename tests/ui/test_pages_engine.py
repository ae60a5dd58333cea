"""Every page under AppTest on the real engine (config.yaml's settings, CPU here), on the
tiny model: any model will do for the pages' wiring, and it is fast (the default model's
chat mode is tested in test_playground_chat.py).

One engine process serves the whole module through the dashboard's own cached client
(ui.engine_link), exactly as under `streamlit run app.py`. Fragment timers (run_every) are not
simulated by AppTest, so each test drives full runs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import streamlit as st
import yaml
from fake_engine import control
from streamlit.testing.v1 import AppTest

import ui.widgets.bench_runner
from engine.envs import GAPLESS_CONFIG
from engine.process.client import EngineClient
from ui.engine_link import _shared_client

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "app.py"
TIMEOUT = 300  # the first run waits for the engine to load the model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineClient]:
    config = tmp_path_factory.mktemp("config") / "tiny.yaml"
    settings = yaml.safe_load((REPO / "config.yaml").read_text())
    settings["model"] = str(REPO / "models" / "gapless-tiny-python")
    config.write_text(yaml.safe_dump(settings))
    cwd, env = os.getcwd(), os.environ.get(GAPLESS_CONFIG)
    os.chdir(REPO)  # .streamlit/ and the pages are found from the repository root
    os.environ[GAPLESS_CONFIG] = str(config)
    st.cache_resource.clear()
    try:
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
        assert not at.exception, at.exception
        client = _shared_client()  # the very client the pages just used
        assert client.alive()
        yield client
    finally:
        st.cache_resource.clear()  # on_release shuts the engine down
        os.chdir(cwd)
        if env is None:
            os.environ.pop(GAPLESS_CONFIG, None)
        else:
            os.environ[GAPLESS_CONFIG] = env


def app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=TIMEOUT)


def live_figures(at: AppTest) -> dict[str, dict]:
    """The figures drawn by ui.widgets.live_plot components, by key."""
    out = {}
    for el in at.get("component_instance"):
        (fig,) = [a.bytes for a in el.proto.special_args if a.key == "figure"]
        out[json.loads(el.proto.json_args)["key"]] = json.loads(fig)
    return out


def page(path: str) -> AppTest:
    at = app()
    at.run()
    return at.switch_page(path).run()


def markdown(at: AppTest) -> str:
    return "\n".join(str(m.value) for m in at.markdown)


def wait_until(predicate: object, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.1)


def test_live_page_reports_the_engines_settings(engine: EngineClient) -> None:
    at = app().run()
    assert not at.exception and not at.error
    settings = engine.settings()
    mode = "async" if settings["async_batching"] else "sync"
    assert f"mode **{mode}**" in markdown(at)
    assert settings["model"] in markdown(at)
    # A CPU engine runs no kernels: no kernel lane (the waterfall's title says so).
    kernels = {"live.kernels"} if settings.get("device") == "cuda" else set()
    assert set(live_figures(at)) == {"live.history", "live.timeline", "live.waterfall",
                                     "live.prefill_tax", "live.gauges"} | kernels
    assert not at.get("plotly_chart")  # every Live chart is drawn in place


def test_toggles_change_the_engines_mode(engine: EngineClient) -> None:
    at = app().run()
    before = engine.settings()["async_batching"]
    control(at, "ctl.async").set_value(not before).run()
    assert engine.settings()["async_batching"] is (not before)
    assert f"mode **{'async' if not before else 'sync'}**" in markdown(at)
    control(at, "ctl.slots").set_value(3).run()
    assert engine.settings()["num_slots"] == 3
    control(at, "ctl.slots").set_value(2).run()
    control(at, "ctl.async").set_value(before).run()
    assert engine.settings()["async_batching"] is before
    assert not at.exception and not at.error


def test_cuda_graphs_toggle_follows_the_device(engine: EngineClient) -> None:
    at = app().run()
    settings = engine.settings()
    graphs = control(at, "ctl.graphs")
    if settings["cuda_graphs_available"]:
        assert not graphs.disabled
        graphs.set_value(not settings["cuda_graphs"]).run()
        assert engine.settings()["cuda_graphs"] is (not settings["cuda_graphs"])
        control(at, "ctl.graphs").set_value(settings["cuda_graphs"]).run()
    else:
        assert graphs.disabled
        assert graphs.help == settings["cuda_graphs_reason"]
        assert any("No GPU" in str(c.value) for c in at.caption)


def test_load_generator_drives_the_engine(engine: EngineClient) -> None:
    at = app().run()
    at.number_input(key="load.concurrency").set_value(4)
    at.number_input(key="load.max_tokens").set_value(16)
    at.button(key="load.start").click().run()
    assert not at.error, [e.value for e in at.error]
    assert engine.load_running()
    steps = engine.stats()["steps"]
    wait_until(lambda: engine.stats()["steps"] > steps + 20)
    at.run()
    timeline = json.dumps(live_figures(at)["live.timeline"])
    assert "decode" in timeline  # hover facts of real steps are drawn
    at.button(key="load.stop").click().run()
    assert not engine.load_running()
    wait_until(lambda: engine.stats()["running"] + engine.stats()["waiting"] == 0)


def test_playground_prompt_gets_an_answer(engine: EngineClient) -> None:
    at = page("ui/pages/playground.py")
    at.slider(key="play.max_tokens").set_value(24)
    at.slider(key="play.temperature").set_value(0.0)
    at.chat_input(key="play.prompt").set_value("def fibonacci(n):").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    reply = at.code[-1].value
    assert reply.strip(), "the reply is empty"
    figures = at.caption[-1].value
    assert "TTFT" in figures and "tokens/s" in figures and "24 tokens" in figures


def test_playground_rejected_prompt_shows_the_engines_message(engine: EngineClient) -> None:
    at = page("ui/pages/playground.py")
    too_long = "x = 1\n" * 4000  # far beyond max_model_len tokens
    at.chat_input(key="play.prompt").set_value(too_long).run()
    assert not at.exception
    assert at.error, "no message for a rejected prompt"
    message = at.error[0].value
    assert message.startswith("The engine rejected the prompt:")
    assert "max_model_len" in message or "too long" in message, message


def test_benchmark_page_completes_on_the_default_model(engine: EngineClient) -> None:
    at = page("ui/pages/benchmark.py")
    at.number_input(key="bench.repetitions").set_value(2)
    at.button(key="bench.run").click().run()
    run = ui.widgets.bench_runner.RUNS.current
    assert run is not None
    run._thread.join(600)  # the benchmark runs beside the page, in the server
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    table = at.dataframe[0].value
    expected = ["sync", "async"]
    if engine.settings()["cuda_graphs_available"]:
        expected += ["sync+graphs", "async+graphs"]
    assert list(table["mode"]) == expected
    assert list(table["runs"]) == [2] * len(expected)
    assert (table["tokens/s (median)"] > 0).all() and (table["total s (median)"] > 0).all()
    verdicts = [m.value for m in (*at.info, *at.success)]
    assert any("total time" in v for v in verdicts)


def test_requests_page_lists_requests_with_latencies(engine: EngineClient) -> None:
    out = engine.generate("import os\n", {"max_tokens": 8, "temperature": 0.0})
    at = page("ui/pages/requests.py")
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    row = table[table["request"] == out.request_id].iloc[0]
    assert row["status"] == "length" and row["output tokens"] == 8
    assert row["TTFT ms"] > 0 and row["e2e ms"] >= row["TTFT ms"]


def test_dead_engine_shows_the_reason_and_restarts(engine: EngineClient) -> None:
    at = app().run()
    assert engine.pid is not None
    os.kill(engine.pid, signal.SIGKILL)
    wait_until(lambda: not engine.alive(), 10.0)
    at.run()
    assert not at.exception
    assert "SIGKILL" in at.error[0].value
    at.button(key="ui.restart").click().run()
    assert engine.alive()
    assert not at.exception and not at.error
    assert "live.timeline" in live_figures(at)


def test_ab_one_click_judges_decode_steps_over_alternated_pairs(engine: EngineClient) -> None:
    at = page("ui/pages/ab.py")
    at.select_slider(key="ab.seconds").set_value(3).run()
    at.button(key="ab.one_click").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    verdicts = [m.value for m in (*at.info, *at.success) if "Decode throughput" in m.value]
    assert len(verdicts) == 1, [m.value for m in (*at.info, *at.success)]
    # sync and async alternated three times, one second each: enough decode-only steps
    assert "t-interval over 3 alternated pairs" in verdicts[0], verdicts[0]
    assert engine.settings()["async_batching"] is True and not engine.load_running()
