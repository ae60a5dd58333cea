"""The Live page's settings controls change the engine only when a person clicks them, once
per click, and say beside themselves what came of a click, at once; while a benchmark holds
the engine they are drawn disabled, saying why.

In the browser a control can be drawn anew by the front end (a fragment redrawn while the
page's run is still going, on a loaded machine): it then reports its drawn default as its
value. A default that is not the engine's value reads as a click nobody made: the async
toggle flipped the engine by itself, and the slots control sent "no value" (refused changes
by the hundred in the server's log, and a message about a control nobody touched).
"""

from __future__ import annotations

from typing import Any

from fake_engine import FakeEngineClient, control
from streamlit.testing.v1 import AppTest
from test_pages_fake import app, texts

import ui.widgets.bench_runner
from ui.widgets.controls import load_state

CONTROLS = ("ctl.async", "ctl.slots", "ctl.graphs", "ctl.sentinel")


def drawn_default(at: AppTest, base: str) -> Any:
    """What the browser shows for a control it draws anew: the widget's own default."""
    w = control(at, base)
    if base == "ctl.slots":
        return [w.proto.options[i].content for i in w.proto.default]
    return w.proto.default


def test_each_control_is_drawn_with_the_engines_value_as_its_default(
        fake: FakeEngineClient) -> None:
    for async_on, slots in ((True, 2), (False, 3), (True, 1)):
        fake.configure(async_batching=async_on, num_slots=slots)
        at = app().run()
        assert drawn_default(at, "ctl.async") is async_on
        assert drawn_default(at, "ctl.slots") == [str(slots)]
        assert drawn_default(at, "ctl.graphs") is False
        assert drawn_default(at, "ctl.sentinel") is False


def test_controls_drawn_anew_by_the_browser_change_nothing(fake: FakeEngineClient) -> None:
    """Every control reports the value it was drawn with (what a control drawn anew sends):
    no change reaches the engine, and no message speaks of a control."""
    at = app().run()
    for base in CONTROLS:
        w = control(at, base)
        if w.disabled:  # CUDA graphs, without a GPU: nobody can click it
            continue
        default = drawn_default(at, base)
        w.set_value(int(default[0]) if base == "ctl.slots" else default)
    at.run()
    assert fake.configured_by == [], "a change nobody made was sent"
    assert fake.settings()["settings_version"] == 0 and fake.settings()["async_batching"]
    assert "not applied" not in texts(at)


def test_one_click_is_one_version_step_and_no_word_on_another_control(
        fake: FakeEngineClient) -> None:
    at = app().run()
    for i, want in enumerate((False, True, False), start=1):
        control(at, "ctl.async").set_value(want).run()
        assert fake.settings()["async_batching"] is want
        assert fake.settings()["settings_version"] == i
        assert control(at, "ctl.async").value is want
        shown = texts(at)
        assert "slot count" not in shown and "Switching" not in shown, shown
    assert len(fake.configured_by) == 3


def test_a_refused_click_is_said_beside_the_control_and_the_control_shows_the_engine(
        fake: FakeEngineClient) -> None:
    """A click on a view another tab made stale is refused by the engine: said at once under
    the controls (in the same run, not kept for another page), naming only that control,
    and the control is drawn anew at the engine's value."""
    first, second = app().run(), app().run()
    control(first, "ctl.slots").set_value(3).run()
    control(second, "ctl.slots").set_value(1).run()  # drawn at version 0: stale
    assert fake.settings()["settings_version"] == 1 and fake.settings()["num_slots"] == 3
    captions = [c.value for c in second.caption if "not applied" in c.value]
    assert len(captions) == 1 and captions[0].startswith(
        ":material/sync_problem: Changing the slot count: not applied"), captions
    assert control(second, "ctl.slots").value == 3  # the engine's, by the first tab
    second.switch_page("ui/pages/playground.py").run()
    assert not second.error, [e.value for e in second.error]  # nothing left to pile up


def test_a_stale_click_the_engine_already_agrees_with_says_nothing(
        fake: FakeEngineClient) -> None:
    """Both tabs switch async off: the second's change is refused (its view was stale), but
    the engine runs what that person asked for, so nothing is said."""
    first, second = app().run(), app().run()
    control(first, "ctl.async").set_value(False).run()
    control(second, "ctl.async").set_value(False).run()
    assert fake.settings()["settings_version"] == 1
    assert "not applied" not in texts(second)
    assert control(second, "ctl.async").value is False


class _Running:
    """A benchmark run of this dashboard, still going (for the banner and the controls)."""

    running = True
    started = 0.0

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.progress = ui.widgets.bench_runner.Progress(run_index=0, runs=4, label="sync #1")


def test_while_a_benchmark_holds_the_engine_the_controls_are_disabled_saying_why(
        fake: FakeEngineClient) -> None:
    at = app().run()
    ui.widgets.bench_runner.RUNS.current = _Running()  # type: ignore[assignment]
    at.run()
    for base in CONTROLS:
        assert control(at, base).disabled, base
    assert at.button(key="load.start").disabled
    assert any("A benchmark holds the engine" in c.value for c in at.caption)


def test_a_refusal_by_the_engine_is_said_beside_the_load_switch_at_once(
        fake: FakeEngineClient) -> None:
    """The engine refuses a start (a benchmark another client began a moment ago): the
    reason is under the load switch in the run that follows the click, once."""
    at = app().run()

    def start_load(spec: Any) -> None:
        raise ValueError("a benchmark is running; start the load generator once it has "
                         "finished")

    fake.start_load = start_load  # type: ignore[method-assign]
    at.button(key="load.start").click().run()
    said = [c.value for c in at.caption if "Starting the load generator" in c.value]
    assert said == [":material/sync_problem: Starting the load generator: a benchmark is "
                    "running; start the load generator once it has finished"], said
    at.run()
    assert not [c.value for c in at.caption if "Starting the load generator" in c.value]


def test_the_load_line_says_who_stopped_the_load(fake: FakeEngineClient) -> None:
    at = app().run()
    at.button(key="load.start").click().run()
    at.button(key="load.stop").click().run()
    fake.load_stats = lambda: {  # type: ignore[method-assign]
        "running": False, "submitted": 40, "finished": 40, "inflight": 0, "dropped": 0,
        "errors": 0, "stopped_reason": "stopped", "spec": None}
    at.run()
    assert "stopped by this tab · submitted 40" in texts(at)
    assert "stopped: stopped" not in texts(at)


def test_the_load_state_names_who_stopped_it() -> None:
    stopped = {"running": False, "submitted": 9, "stopped_reason": "stopped"}
    assert load_state(stopped, "tab a", "tab b") == "stopped by tab b"
    assert load_state(stopped, "tab a", "tab a") == "stopped by this tab"
    assert load_state(stopped, "tab a", None) == "stopped by a client outside this dashboard"
    assert load_state({"running": False, "submitted": 0, "stopped_reason": None}, "tab a",
                      None) == "not started"
    assert load_state({"running": False, "stopped_reason": "the engine shut down"}, "tab a",
                      "tab b") == "stopped: the engine shut down"
