"""The dashboard as a monitor under AppTest on the stand-in engine: one truth
across tabs, a hung engine on every page, restart keeping the settings, widgets that
validate as the engine does, the A/B view and the recordings.

AppTest does not run fragments' timers; a "second tab" is a second AppTest on the same
server-wide client, and "within 2 s" is the banner's one-second fragment, checked in the
browser test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import (
    FakeClientWithoutHeartbeat,
    FakeEngineClient,
    control,
    reset_shared_state,
)
from streamlit.testing.v1 import AppTest
from test_pages_fake import app, texts

import ui.engine_link
import ui.widgets.bench_runner
from ui.figures.recordings import RECORDINGS_DIR

PAGES = ("ui/pages/playground.py", "ui/pages/benchmark.py", "ui/pages/ab.py",
         "ui/pages/requests.py")
# AppTest keeps only a file page's own elements, not those app.py draws before running it
# (the banner): the banner on those pages is checked in the browser test.


def on_page(page: str | None) -> AppTest:
    at = app().run()
    if page is not None:
        at.switch_page(page).run()
    return at


@pytest.mark.parametrize("page", [None])
def test_the_settings_shown_follow_a_change_made_elsewhere(
    fake: FakeEngineClient, page: str | None
) -> None:
    at = on_page(page)
    assert "mode **async**" in texts(at)
    fake.configure(async_batching=False, num_slots=1)  # another tab, or an API call
    at.run()
    assert "mode **sync** · 1 slot ·" in texts(at)


@pytest.mark.parametrize("page", [None, *PAGES])
def test_a_hung_engine_is_reported_on_every_page_with_kill_and_restart(
    fake: FakeEngineClient, page: str | None
) -> None:
    at = on_page(page)
    fake.hung = True
    at.run()
    assert not at.exception
    assert any("not responding" in e.value for e in at.error)
    assert at.button(key="ui.kill_restart_page").label == "Kill and restart the engine"


def test_without_a_heartbeat_a_call_that_times_out_says_not_responding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streamlit as st

    client = FakeClientWithoutHeartbeat()
    st.cache_resource.clear()
    reset_shared_state()
    monkeypatch.setattr(ui.engine_link, "make_client", lambda: client)
    at = app().run()
    client.hung = True
    at.run()
    assert not at.exception
    assert any("not responding" in e.value for e in at.error)
    st.cache_resource.clear()


def test_kill_and_restart_recovers_and_keeps_the_live_settings(fake: FakeEngineClient) -> None:
    at = app().run()
    control(at, "ctl.async").set_value(False).run()
    control(at, "ctl.slots").set_value(3).run()
    fake.hung = True
    at.run()
    at.button(key="ui.kill_restart_page").click().run()
    assert fake.alive() and not fake.hung and fake.restarts == 1
    assert fake.settings()["async_batching"] is False and fake.settings()["num_slots"] == 3
    assert "mode **sync** · 3 slots" in texts(at)


def test_restart_after_a_death_keeps_the_live_settings(fake: FakeEngineClient) -> None:
    at = app().run()
    control(at, "ctl.slots").set_value(1).run()
    fake.kill()
    at.run()
    at.button(key="ui.restart").click().run()
    assert fake.settings()["num_slots"] == 1


def test_a_running_benchmark_is_announced_in_the_banner(fake: FakeEngineClient) -> None:
    class Endless:
        running = True
        started = 0.0

        def __init__(self) -> None:
            import threading

            self.lock = threading.Lock()
            self.progress = ui.widgets.bench_runner.Progress(run_index=1, runs=6, label="async #1")

    ui.widgets.bench_runner.RUNS.current = Endless()  # type: ignore[assignment]
    at = on_page(None)
    assert any("A benchmark is running" in w.value and "run 2 of 6" in w.value
               for w in at.warning)


@pytest.mark.parametrize(
    ("widget", "value", "message"),
    [("play.top_k", 0, "top_k must be -1 (off) or an integer in [1, 2147483647]"),
     ("play.seed", "-5", "seed must be None or an integer in [0, 2147483647]")],
)
def test_playground_widgets_refuse_what_the_engine_would(
    fake: FakeEngineClient, widget: str, value: object, message: str
) -> None:
    at = on_page("ui/pages/playground.py")
    if widget == "play.seed":
        at.text_input(key=widget).set_value(value).run()
    else:
        at.number_input(key=widget).set_value(value).run()
    assert any(message in e.value for e in at.error)
    assert at.chat_input(key="play.prompt").proto.disabled


def test_ab_one_click_captures_sync_then_async_and_restores(fake: FakeEngineClient) -> None:
    at = on_page("ui/pages/ab.py")
    at.select_slider(key="ab.seconds").set_value(1).run()
    at.button(key="ab.one_click").click().run()
    assert not at.exception
    assert fake.settings()["async_batching"] is True  # put back
    assert not fake.load_running()  # the load it started for the capture is stopped
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    timelines = [s for s in specs if "cpu.prepare" in s and "ms before the window" in s]
    assert len(timelines) == 2
    assert "sync" in timelines[0] and "async" in timelines[1]
    verdicts = [m.value for m in (*at.info, *at.success) if "Decode throughput" in m.value]
    assert len(verdicts) == 1, verdicts
    # sync and async alternated three times: the interval comes from those pairs
    assert "t-interval over 3 alternated pairs" in verdicts[0], verdicts[0]


def recordings_page(monkeypatch: pytest.MonkeyPatch, timeout_s: float) -> AppTest:
    """The Recordings page, run with an engine client that fails the test if started."""
    import streamlit as st

    def no_engine() -> FakeEngineClient:
        raise AssertionError("the Recordings page must not start an engine")

    st.cache_resource.clear()
    monkeypatch.setattr(ui.engine_link, "make_client", no_engine)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"),
                           default_timeout=timeout_s)
    return at.switch_page("ui/pages/recordings.py").run()


def test_recordings_page_opens_the_shipped_recording_without_an_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert (RECORDINGS_DIR / "cpu-tiny.jsonl").is_file()
    at = recordings_page(monkeypatch, timeout_s=30)
    at.selectbox(key="rec.pick").set_value("cpu-tiny.jsonl").run()
    assert not at.exception, at.exception
    assert list(at.dataframe[0].value["mode"]) == ["sync", "async"]
    assert any("CPU" in m.value and "commit" in m.value for m in at.markdown)
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert len([s for s in specs if "cpu.prepare" in s and "ms before the window" in s]) == 2


def test_recordings_page_draws_the_prefill_tax_of_a_one_mode_recording(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shipped prefill-tax recording (sync only: its timeline drawn once per side) opens
    with its prefill tax: the headline, the fit's terms, the three panels."""
    at = recordings_page(monkeypatch, timeout_s=60)
    at.selectbox(key="rec.pick").set_value("cpu-prefill-tax.jsonl").run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("**Each 1,000 prefill tokens add") for m in at.markdown)
    assert any("prefill" in c.value and "per 1,000 prefill tokens" in c.value
               for c in at.caption)
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("95% band" in s and "ITL of running requests" in s for s in specs)


def test_recordings_page_names_the_h200_async_gain_with_its_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at = recordings_page(monkeypatch, timeout_s=60)
    at.selectbox(key="rec.pick").set_value("h200-llama-1b.jsonl").run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert list(table["mode"]) == ["sync+graphs", "async+graphs"]
    assert list(table["prefill steps"]) == [5, 5]  # prefill reported apart
    wins = [m.value for m in at.success if "Decode throughput" in m.value]
    assert len(wins) == 1 and not [m for m in at.info if "Decode throughput" in m.value]
    assert "async+graphs is" in wins[0] and "faster than sync+graphs" in wins[0]
    assert "95% interval +" in wins[0] and "block bootstrap" in wins[0]
    assert "no measurable difference" not in wins[0]


def test_a_restart_in_one_tab_makes_the_others_stale_restart_do_nothing(
        fake: FakeEngineClient) -> None:
    """Both tabs show the dead engine; the first restarts it; the second's button, drawn for
    the dead engine, then does nothing and says so (it used to kill the new engine)."""
    first, second = app().run(), app().run()
    fake.kill()
    first.run()
    second.run()
    first.button(key="ui.restart").click().run()
    assert fake.restarts == 1 and fake.alive()
    second.button(key="ui.restart").click().run()
    assert fake.restarts == 1, "a stale view's restart restarted the engine again"
    assert any("the engine is running" in i.value for i in second.info), (
        [e.value for e in second.info], [e.value for e in second.error], texts(second))
    assert "mode **" in texts(second)  # and the second tab shows the running engine


def test_a_stale_kill_button_kills_nothing(fake: FakeEngineClient) -> None:
    first, second = app().run(), app().run()
    fake.hung = True
    first.run()
    second.run()
    first.button(key="ui.kill_restart_page").click().run()
    assert fake.restarts == 1 and not fake.hung
    second.button(key="ui.kill_restart_page").click().run()
    assert fake.restarts == 1
    assert any("Nothing done" in i.value for i in second.info)


def test_a_restart_brings_the_load_generator_back(fake: FakeEngineClient) -> None:
    at = app().run()
    at.button(key="load.start").click().run()
    assert fake.load_stats()["running"]
    fake.kill()
    fake._load = False  # the dead engine's load generator is gone with it
    at.run()
    at.button(key="ui.restart").click().run()
    assert fake.restarts == 1 and fake.load_stats()["running"]


def test_two_tabs_restarting_at_the_same_moment_restart_once(fake: FakeEngineClient) -> None:
    """Both tabs saw the same dead engine and click Restart together (two script threads of
    one server): the second checks only after the first restart is done, and is told it is
    stale. Without the lock both passed the check before either moved the generation, and
    the engine was restarted twice (the browser's two-tab test, under load)."""
    import threading
    import time

    from engine.process.supervision import RestartRefused
    from ui.engine_link import restart_keeping_settings

    fake.kill()
    seen = fake.generation
    slow_restart = fake.restart

    def restart() -> None:
        time.sleep(0.2)  # a real start takes seconds: the other tab clicks meanwhile
        slow_restart()

    fake.restart = restart
    outcomes: list[str] = []

    def tab(name: str) -> None:
        try:
            restart_keeping_settings(fake, name, seen_generation=seen)
            outcomes.append("restarted")
        except RestartRefused:
            outcomes.append("stale")

    threads = [threading.Thread(target=tab, args=(f"tab {i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(outcomes) == ["restarted", "stale"] and fake.restarts == 1
