"""The Live page's token budget: in the mode line, a control drawn at the engine's value within
its range that changes it once per change as a compare-and-set (a stale one is refused and
said beside it), and the what-if panel's table of changes, which shows a change made from any
tab."""

from __future__ import annotations

from fake_engine import FakeEngineClient, control
from test_pages_fake import app, texts


def tables(at) -> list:
    return [t.value for t in at.table]


def test_the_mode_line_names_the_budget(fake: FakeEngineClient) -> None:
    at = app().run()
    assert "budget 512 tokens" in texts(at)
    fake.configure(max_num_batched_tokens=64)
    assert "budget 64 tokens" in texts(app().run())


def test_the_control_is_drawn_at_the_engines_value_within_its_range(
        fake: FakeEngineClient) -> None:
    w = control(app().run(), "ctl.budget")
    assert (w.value, w.min, w.max) == (512, 8, 512)
    fake.configure(max_num_batched_tokens=100)
    assert control(app().run(), "ctl.budget").value == 100


def test_a_change_is_sent_once_versioned_and_shown_as_a_change(
        fake: FakeEngineClient) -> None:
    at = app().run()
    control(at, "ctl.budget").set_value(64).run()
    assert fake.settings()["max_num_batched_tokens"] == 64
    assert fake.settings()["settings_version"] == 1
    assert len(fake.configured_by) == 1 and fake.configured_by[0]  # the tab that changed it
    at.run()  # the panel's next refresh sees the new budget
    assert control(at, "ctl.budget").value == 64
    assert fake.settings()["settings_version"] == 1  # a redraw sends nothing
    (changes,) = [t for t in tables(at) if "change" in t.columns]
    assert list(changes["change"]) == ["512 → 64", "512 → 64"]
    assert list(changes["budget (tokens)"]) == ["64 (after)", "512 (before)"]


def test_a_change_from_another_tab_is_shown_and_a_stale_one_is_refused_beside_the_control(
        fake: FakeEngineClient) -> None:
    first, second = app().run(), app().run()
    control(first, "ctl.budget").set_value(64).run()
    control(second, "ctl.budget").set_value(128).run()  # drawn at version 0: stale
    assert fake.settings()["max_num_batched_tokens"] == 64
    assert "Changing the token budget: not applied" in texts(second)
    assert control(second, "ctl.budget").value == 64
    second.run()
    (changes,) = [t for t in tables(second) if "change" in t.columns]
    assert list(changes["change"]) == ["512 → 64", "512 → 64"]
    assert list(changes["budget (tokens)"]) == ["64 (after)", "512 (before)"]
