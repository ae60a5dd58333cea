"""Every page under AppTest against a stand-in engine: controls, prompts, benchmark, errors.

The stand-in (fake_engine.FakeEngineClient) is swapped in through ui.engine_link.make_client, so
these tests run in a second and can make the engine die or reject a prompt on purpose.
test_pages_engine.py runs the same pages on the real engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import streamlit as st
from fake_engine import FakeEngineClient, control
from streamlit.testing.v1 import AppTest

import ui.engine_link
import ui.widgets.bench_runner
from ui.widgets.controls import LOAD_CONC_KEY

APP = Path(__file__).resolve().parents[2] / "app.py"
TIMEOUT = 30


def app() -> AppTest:
    return AppTest.from_file(str(APP), default_timeout=TIMEOUT)


def live_figures(at: AppTest) -> dict[str, dict]:
    """The figures drawn by ui.widgets.live_plot components, by key (JSON as the browser
    gets it)."""
    out = {}
    for el in at.get("component_instance"):
        key = json.loads(el.proto.json_args)["key"]
        (fig,) = [a.bytes for a in el.proto.special_args if a.key == "figure"]
        out[key] = json.loads(fig)
    return out


def timeline_title(at: AppTest) -> str:
    return live_figures(at)["live.timeline"]["layout"]["title"]["text"]


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [e.value for e in at.error]
    parts += [i.value for i in at.info] + [c.value for c in at.caption]
    return "\n".join(str(p) for p in parts)


def test_live_page_shows_history_timeline_and_controls(fake: FakeEngineClient) -> None:
    at = app().run()
    assert not at.exception
    assert "mode **async**" in texts(at)
    figs = live_figures(at)
    # One row of the controls that act on the engine (async, slots, graphs, load on/off)
    # comes first, then the history strip and the timeline: the first screen holds both.
    # Everything else (pause, window, load parameters, gauges) comes after the timeline.
    assert list(figs)[:2] == ["live.history", "live.timeline"]
    elements = list(enumerate(at.main))
    first_chart = next(i for i, el in elements if el.type == "component_instance")
    keyed = {str(getattr(el, "key", "")): i for i, el in elements}
    async_at = next(i for k, i in keyed.items() if k.startswith("ctl.async."))
    assert async_at < first_chart and keyed["load.start"] < first_chart
    assert keyed["live.pause"] > first_chart
    assert keyed[LOAD_CONC_KEY] > first_chart  # the load's parameters sit below the charts
    ticks = figs["live.timeline"]["layout"]["yaxis"]["ticktext"]
    assert "compute" in ticks and "cpu.prepare" in ticks
    assert control(at, "ctl.async").value is True
    assert control(at, "ctl.graphs").disabled  # no GPU
    assert "No GPU" in texts(at)
    assert "No GPU (no GPU" not in texts(at)  # said once


def test_history_strip_has_the_four_figures_with_units(fake: FakeEngineClient) -> None:
    at = app().run()
    titles = [a["text"] for a in live_figures(at)["live.history"]["layout"]["annotations"]]
    assert any(t.startswith("tokens/s") and "tok/s" in t for t in titles)
    assert any(t.startswith("step busy") and "%" in t for t in titles)
    assert any(t.startswith("requests running / waiting") for t in titles)
    # No GPU: the memory bandwidth figure says why it is missing instead of a number.
    assert "memory bandwidth used: no GPU here" in titles
    assert ("it reads a GPU's memory counters (NVML GPM); this engine runs on the CPU"
            in [t.replace("<br>", " ") for t in titles]), titles


def test_async_toggle_and_slots_change_the_engines_mode(fake: FakeEngineClient) -> None:
    at = app().run()
    control(at, "ctl.async").set_value(False).run()
    assert fake.settings()["async_batching"] is False
    assert "mode **sync**" in texts(at)
    control(at, "ctl.slots").set_value(3).run()
    assert fake.settings()["num_slots"] == 3
    assert not at.exception


def test_widgets_follow_the_engine_when_another_tab_changes_it(fake: FakeEngineClient) -> None:
    at = app().run()
    fake.configure(async_batching=False, num_slots=1)
    at.run()
    assert control(at, "ctl.async").value is False
    assert control(at, "ctl.slots").value == 1


def test_load_generator_starts_and_stops(fake: FakeEngineClient) -> None:
    at = app().run()
    at.number_input(key="load.concurrency").set_value(4)
    at.button(key="load.start").click().run()
    assert fake.load_running()
    assert fake.load_spec.concurrency == 4 and fake.load_spec.rate is None
    assert "dropped arrivals 2" in texts(at)  # the generator's counts are shown
    at.button(key="load.stop").click().run()
    assert not fake.load_running()


def test_load_lengths_are_judged_as_typed_against_max_model_len(fake: FakeEngineClient) -> None:
    """No bound of the box's own: a value typed above it would be kept at the last valid one,
    and the message would speak of that old value."""
    at = app().run()
    at.number_input(key="load.prompt_len").set_value(200).run()
    at.number_input(key="load.max_tokens").set_value(100).run()
    assert at.button(key="load.start").disabled
    assert any("prompt + output = 300 tokens exceeds the engine's max_model_len of 256"
               in e.value for e in at.error)
    at.number_input(key="load.prompt_len").set_value(5000).run()
    assert any("= 5100 tokens" in e.value for e in at.error), [e.value for e in at.error]
    at.number_input(key="load.prompt_len").set_value(64).run()
    assert not at.error and not at.button(key="load.start").disabled


def test_pause_freezes_the_timeline_and_offers_its_trace(fake: FakeEngineClient) -> None:
    at = app().run()
    at.button(key="live.trace_pause").click().run()
    assert at.toggle(key="live.pause").value is True
    frozen = live_figures(at)["live.timeline"]
    assert timeline_title(at).startswith("Paused")
    fake.publish_steps(50)
    at.run()
    assert live_figures(at)["live.timeline"] == frozen  # nothing new drawn while paused
    download = at.get("download_button")[0]
    assert not download.proto.disabled
    assert download.proto.url  # a file is registered, not built on click
    at.toggle(key="live.pause").set_value(False).run()
    assert timeline_title(at).startswith("Live")
    assert not at.get("download_button")


def test_dead_engine_shows_a_message_and_restart_brings_it_back(fake: FakeEngineClient) -> None:
    at = app().run()
    fake.kill("engine process exited with code -9 (SIGKILL)")
    at.run()
    assert not at.exception
    assert "SIGKILL" in at.error[0].value
    at.button(key="ui.restart").click().run()
    assert fake.alive()
    assert "live.timeline" in live_figures(at) and not at.error


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
    monkeypatch.setattr(ui.engine_link, "make_client", broken)
    at = app().run()
    assert not at.exception
    assert "could not start" in at.error[0].value and "config.yaml" in at.error[0].value


def test_graphs_toggle_is_enabled_with_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeEngineClient(graphs_available=True)
    st.cache_resource.clear()
    monkeypatch.setattr(ui.engine_link, "make_client", lambda: client)
    at = app().run()
    graphs = control(at, "ctl.graphs")
    assert not graphs.disabled
    graphs.set_value(True).run()
    assert client.settings()["cuda_graphs"] is True
    assert "No GPU" not in texts(at)
    st.cache_resource.clear()


def test_playground_prompt_gets_an_answer_with_figures(fake: FakeEngineClient) -> None:
    at = app()
    at.run()
    at.switch_page("ui/pages/playground.py").run()
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
    at.switch_page("ui/pages/playground.py").run()
    at.chat_input(key="play.prompt").set_value("x" * 3000).run()
    assert not at.exception
    assert "max_model_len" in at.error[0].value


def test_benchmark_page_runs_every_mode_and_compares(fake: FakeEngineClient) -> None:
    at = app()
    at.run()
    at.switch_page("ui/pages/benchmark.py").run()
    at.button(key="bench.run").click().run()
    run = ui.widgets.bench_runner.RUNS.current
    assert run is not None
    run._thread.join(10)
    at.run()
    assert not at.exception
    assert [r.mode_label for r in run.results] == [
        "sync #1", "async #1", "sync #2", "async #2", "sync #3", "async #3"
    ]  # alternated, three repetitions by default
    table = at.dataframe[0].value
    assert list(table["mode"]) == ["sync", "async"]
    assert list(table["runs"]) == [3, 3]
    assert list(table["total s (spread)"]) == ["2.010-2.030", "1.510-1.530"]
    # async's runs all beat sync's: a measurable difference, said as such.
    assert any("async is 24.8% faster than sync" in s.value for s in at.success), [
        s.value for s in at.success]
    charts = [c.proto.spec for c in at.get("plotly_chart")]
    timelines = [c for c in charts if "cpu.prepare" in c and "ms before the window" in c]
    assert len(timelines) == 2  # the median runs of both modes, side by side


def test_requests_page_lists_requests_with_latencies(fake: FakeEngineClient) -> None:
    for _ in range(3):
        rid = fake.submit("def f")
        list(fake.stream(rid))
    at = app()
    at.run()
    at.switch_page("ui/pages/requests.py").run()
    assert not at.exception
    table = at.dataframe[0].value
    assert len(table) == 3
    assert set(table["status"]) == {"length"}
    assert (table["TTFT ms"] > 0).all()
    assert len(at.get("plotly_chart")) == 1


def test_a_change_made_on_a_stale_view_is_refused_not_applied(fake: FakeEngineClient) -> None:
    """Two tabs at settings version 0; the first changes the slots (version 1); the second,
    not yet redrawn, changes them too: its change carries version 0 and the engine refuses
    it, so the engine keeps the first tab's value and the second tab then shows it."""
    first, second = app().run(), app().run()
    control(first, "ctl.slots").set_value(3).run()
    assert fake.settings()["num_slots"] == 3 and fake.settings()["settings_version"] == 1
    stale = control(second, "ctl.slots")
    assert stale.key.endswith(".0")  # drawn at version 0
    stale.set_value(1).run()
    assert fake.settings()["num_slots"] == 3, "a stale view's change was applied"
    assert fake.settings()["settings_version"] == 1
    assert control(second, "ctl.slots").value == 3  # the second tab now shows the engine's
    assert "not applied" in texts(second)
    assert all(o and o.startswith(("tab ", "a tab")) for o in fake.configured_by)


def test_the_sentinel_is_one_toggle_away_and_shows_its_mismatch_count(
        fake: FakeEngineClient) -> None:
    at = app().run()
    assert control(at, "ctl.sentinel").value is False
    control(at, "ctl.sentinel").set_value(True).run()
    assert fake.settings()["sentinel_sample_every"] == 64
    assert control(at, "ctl.sentinel").value is True
    assert "checked 12 · mismatches 0 (0.0%)" in texts(at)
    control(at, "ctl.sentinel").set_value(False).run()
    assert fake.settings()["sentinel_sample_every"] == 0


def test_tables_show_a_figure_that_does_not_apply_as_a_dash_not_none(
        fake: FakeEngineClient) -> None:
    """The Benchmark table's async prediction of an async run and the Requests table's
    end-to-end time of a request still running have no value: a dash, not "None"."""
    at = app().run()
    at.switch_page("ui/pages/benchmark.py").run()
    at.number_input(key="bench.repetitions").set_value(1)
    at.button(key="bench.run").click().run()
    run = ui.widgets.bench_runner.RUNS.current
    assert run is not None and run._thread is not None
    run._thread.join(30)
    at.run()
    table = at.dataframe[0]  # the results, one row per mode
    assert table.value["predicted async s (median)"].isna().any()
    assert table.proto.placeholder == "–"
    fake.submit("a request still running")
    at.switch_page("ui/pages/requests.py").run()
    requests = at.dataframe[0]
    assert requests.value["e2e ms"].isna().any()
    assert all(d.proto.placeholder == "–" for d in at.dataframe)
