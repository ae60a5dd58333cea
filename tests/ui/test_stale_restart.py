"""A Restart button left over from a dead engine never restarts a healthy one, and every
change a tab makes to the engine is logged with the tab that asked.

In Chromium, with a Live tab and a Benchmark tab, a kill -9 and Restart clicked in the Live
tab: the Benchmark tab's dead page ran again during that restart and drew its Restart button
with the new engine's generation, so a click on it, once the engine ran, passed the
staleness check (generations only) and replaced the healthy engine, its requests and load.
"""

from __future__ import annotations

import logging

import pytest
from fake_engine import FakeEngineClient
from test_pages_fake import app, texts

import ui.widgets.bench_runner
from engine.process.supervision import RestartRefused
from ui.engine_link import restart_keeping_settings


def test_a_plain_restart_is_refused_whenever_the_engine_runs(
        fake: FakeEngineClient, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever generation the asking view carries (here the running engine's own), a plain
    restart of an engine that runs does nothing, and the refusal is logged naming the tab."""
    caplog.set_level(logging.WARNING, logger="gapless.ui")
    with pytest.raises(RestartRefused, match="the engine is running"):
        restart_keeping_settings(fake, "tab of-test", seen_generation=fake.generation)
    assert getattr(fake, "restarts", 0) == 0
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and "tab of-test" in refused[0], refused


def test_a_dead_page_drawn_during_another_tabs_restart_cannot_restart_it_again(
        fake: FakeEngineClient) -> None:
    """The second tab's dead page runs again while the first tab's restart is under way,
    after the generation moved: its Restart button is drawn disabled, saying which tab is
    restarting, and a click on it once the engine runs restarts nothing."""
    first, second = app().run(), app().run()
    fake.kill()
    first.run()
    second.run()
    finish_restart = fake.restart

    def restart() -> None:
        fake.generation += 1  # a start moves the generation first
        second.run()  # the other tab's page, drawn meanwhile
        fake.generation -= 1
        finish_restart()

    fake.restart = restart  # type: ignore[method-assign]
    first.button(key="ui.restart").click().run()
    assert fake.restarts == 1 and fake.alive()
    assert "is restarting the engine" in texts(second)
    button = second.button(key="ui.restart")
    assert button.disabled, "the stale Restart button could be clicked"
    fake.restart = finish_restart  # type: ignore[method-assign]
    # What a click that still got through does (the old page drew the button enabled):
    second.session_state["ui.restart_asked"] = ("restart", fake.generation, "ui.restart")
    second.run()
    assert fake.restarts == 1, "a stale Restart click restarted the healthy engine"
    assert any("the engine is running" in i.value for i in second.info)
    assert "mode **" in texts(second)


def test_changes_made_by_a_restart_are_logged_by_the_tab(fake: FakeEngineClient) -> None:
    at = app().run()
    at.toggle(key=next(t.key for t in at.toggle if t.key.startswith("ctl.async."))
              ).set_value(False).run()
    fake.kill()
    at.run()
    at.button(key="ui.restart").click().run()
    assert fake.configured_by[-1] is not None
    assert fake.configured_by[-1].startswith("tab ")
    assert fake.configured_by[-1].endswith("putting back the settings after a restart")


def test_changes_made_by_the_ab_comparison_are_logged_by_the_tab(
        fake: FakeEngineClient) -> None:
    at = app().run()
    at.switch_page("ui/pages/ab.py").run()
    at.select_slider(key="ab.seconds").set_value(1)
    at.button(key="ab.one_click").click().run()
    assert fake.configured_by and all(
        o is not None and o.startswith("tab ") and o.endswith("A/B comparison")
        for o in fake.configured_by), fake.configured_by


def test_a_benchmark_is_logged_with_the_tab_that_started_it(
        fake: FakeEngineClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gapless.ui")
    at = app().run()
    at.switch_page("ui/pages/benchmark.py").run()
    at.number_input(key="bench.repetitions").set_value(1)
    at.button(key="bench.run").click().run()
    run = ui.widgets.bench_runner.RUNS.current
    assert run is not None and run._thread is not None
    run._thread.join(30)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("benchmark")]
    assert len(said) == 2, said
    assert said[0].startswith("benchmark started by tab ") and "settings" in said[0]
    assert said[1].startswith("benchmark started by tab ") and " done after " in said[1]
