"""A busy engine is not a hung one: a call that outlasts its limit while the engine's
heartbeat still comes says "busy" and tries again, never "not responding" with a kill
button. On a loaded machine a page's settings call can answer late (the engine mid-step)
though no signal was sent and the heartbeat never stopped.

The real client raises a plain TimeoutError for a late answer and EngineNotResponding only
once the heartbeat has been silent (engine/process/session.py); the stand-in here does the
same, with a status() that says "alive" throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fake_engine import FakeEngineClient, serve_client
from test_pages_fake import app

from engine.process.client import EngineNotResponding


class BusyEngine(FakeEngineClient):
    """Its heartbeat comes (status() "alive"), but a settings call answers late while
    ``late`` is set; with ``silent`` set the heartbeat has stopped too."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.late = False
        self.silent = False

    def status(self) -> str:
        return "not_responding" if self.silent else super().status()

    def settings(self) -> dict[str, Any]:
        if self.silent:
            raise EngineNotResponding("the engine process has sent nothing for 2.4 s", 2.4)
        if self.late:
            raise TimeoutError("the engine did not answer settings within 2 s")
        return super().settings()


@pytest.fixture
def busy(monkeypatch: pytest.MonkeyPatch) -> Iterator[BusyEngine]:
    yield from serve_client(monkeypatch, BusyEngine())


def test_a_late_answer_with_the_heartbeat_coming_says_busy_not_hung(busy: BusyEngine) -> None:
    at = app().run()
    busy.late = True
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert not [e for e in errors if "not responding" in e], errors
    assert not [b for b in at.button if "kill_restart" in str(b.key)]
    assert any("The engine is busy" in i.value and "no answer within 2 s" in i.value
               for i in at.info), [i.value for i in at.info]
    busy.late = False
    at.run()  # what the page's one-second watch does
    assert not at.info and not at.error
    assert at.button(key="live.trace_pause")


def test_silence_of_the_heartbeat_still_says_not_responding(busy: BusyEngine) -> None:
    """The negative control: the same late call with the heartbeat gone is a hang."""
    at = app().run()
    busy.silent = True
    at.run()
    assert not at.exception
    assert any("not responding" in e.value for e in at.error)
    assert at.button(key="ui.kill_restart_page").label == "Kill and restart the engine"
