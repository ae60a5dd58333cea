"""An engine that dies while a live fragment runs: the whole page shows the dead-engine message
at the top level (never inside the fragment, never as a traceback), and ui.widgets.fragments' marker
says where a body runs.

In Chromium a tab on the Live page (three live fragments) was sometimes left blank after the
engine was killed, while a tab on a page without them showed the message (ui/widgets/fragments.py).
AppTest runs fragments inside the full run and not on their timers, which is enough to see
where the message is drawn.
"""

from __future__ import annotations

import pytest
from fake_engine import FakeEngineClient
from streamlit.testing.v1 import AppTest
from test_pages_fake import app, texts

PAUSE_KEY = "live.pause"  # ui/pages/live.py's (a page script, not imported here)
DEAD = "The engine is not running: engine process exited with code -9 (SIGKILL)."


def dies_on_first_stats(fake: FakeEngineClient) -> None:
    """The engine dies at the first stats() call: the live view's, inside its fragment,
    after the page's top checked that the engine was alive."""
    alive_stats = fake.stats
    killed: list[bool] = []

    def stats() -> dict[str, int]:
        if not killed:
            killed.append(True)
            fake.kill()
        return alive_stats()

    fake.stats = stats  # type: ignore[method-assign]


def test_a_death_inside_the_live_fragment_shows_the_dead_page_at_the_top(
        fake: FakeEngineClient) -> None:
    at = app().run()
    assert not at.exception and "mode **async**" in texts(at)
    dies_on_first_stats(fake)
    at.run()
    assert not at.exception, [e.value for e in at.exception]  # was a traceback
    errors = [e.value for e in at.error]
    assert errors == ["The engine is not running: engine process exited with code -9 (SIGKILL)."
                      ], errors
    assert at.button(key="ui.restart").label == "Restart the engine"
    # The page stopped at its top: none of the Live page's own widgets were drawn (inside
    # the fragment, the message came after the charts and controls drawn before it).
    assert not [t for t in at.toggle if t.key == PAUSE_KEY]
    at.button(key="ui.restart").click().run()
    assert fake.alive() and not at.exception and "mode **async**" in texts(at)


def _marker_app() -> None:
    import streamlit as st

    from ui.widgets.fragments import in_fragment, live_fragment

    st.session_state["outside"] = in_fragment()

    def body() -> None:
        st.session_state["inside"] = in_fragment()

    live_fragment(body, 1.0)()
    st.session_state["after"] = in_fragment()
    st.write("drawn after the fragment")


def test_the_marker_is_set_only_while_a_live_fragment_body_runs() -> None:
    at = AppTest.from_function(_marker_app).run()
    assert not at.exception
    assert (at.session_state["outside"], at.session_state["inside"],
            at.session_state["after"]) == (False, True, False)


def stored_fragments(at: AppTest) -> int:
    """How many fragments the session's Streamlit keeps, each of which the browser's timer
    can run again (AppTest keeps the session's fragment storage across its runs)."""
    return len(at._fragment_storage._fragments)


@pytest.mark.parametrize("page", [None, "ui/pages/benchmark.py", "ui/pages/requests.py"])
def test_a_dead_page_keeps_no_fragment_of_the_page_it_replaced(
        fake: FakeEngineClient, page: str | None) -> None:
    """After a kill each page is replaced by the dead-engine page: the fragments of the page
    before must be gone, or a timer rerun of one, sent by the browser before it learnt of
    the new run, writes into the stopped page ("Bad delta path index", a blank tab)."""
    at = app().run()
    if page is not None:
        at.switch_page(page).run()
    assert not at.exception and stored_fragments(at) >= 1
    fake.kill()
    at.run()
    assert [e.value for e in at.error] == [DEAD], texts(at)
    assert stored_fragments(at) == 1  # the dead page's own watch


def test_a_death_inside_the_benchmark_controls_shows_the_dead_page_at_the_top(
        fake: FakeEngineClient) -> None:
    """The Benchmark page's controls fragment meets the death first (its load_running()
    call): the whole app runs again and stops at the top, never a dead page (with its own
    timed watch) drawn inside the fragment, under the page's title."""
    at = app().run()
    at.switch_page("ui/pages/benchmark.py").run()
    assert [t.value for t in at.title] == ["Benchmark"]
    alive_load_running = fake.load_running

    def load_running() -> bool:
        fake.kill()
        return alive_load_running()

    fake.load_running = load_running  # type: ignore[method-assign]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [DEAD]
    assert not at.title, "the dead page was drawn inside the page's fragment"
