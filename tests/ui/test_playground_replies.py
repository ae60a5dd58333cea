"""ui.widgets.conversation without an engine: the settings line names what acts, a reply cut
by a dead engine keeps the text the tab saw, a cut reply is settled with the engine's own
end, and a stream that goes silent calls ``waiting`` (where the page says the engine hangs).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ui.widgets.conversation import Reply, finish, follow, interrupt, settings_line, settle


@pytest.mark.parametrize(("params", "line"), [
    ({"temperature": 0.0, "top_p": 0.5, "top_k": 5, "max_tokens": 64, "seed": 3},
     "greedy · max 64 tokens"),  # top-p, top-k and seed do nothing greedily: not named
    ({"temperature": 0.8, "top_p": 0.9, "top_k": 50, "max_tokens": 32},
     "temperature 0.8 · top-p 0.9 · top-k 50 · max 32 tokens · random seed"),
    ({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_tokens": 8, "seed": 7,
      "ignore_eos": True, "stop": ["\n\n"]},
     "temperature 1 · max 8 tokens · seed 7 · past EOS · stop at '\\n\\n'"),
])
def test_the_settings_line_names_what_acts(params: dict, line: str) -> None:
    assert settings_line(params) == line


@dataclass
class Out:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    error: str | None = None
    num_cached_tokens: int = 0


def test_a_dead_engines_shorter_text_does_not_replace_what_was_shown() -> None:
    reply = Reply("p", "greedy · max 8 tokens", text="Hello wor", t_submit=1.0, t_first=1.1)
    finish(reply, Out("Hello", [1], "error", error="engine process exited (SIGKILL)"), 2.0)
    assert reply.text == "Hello wor"
    assert reply.cut == "cut short: engine process exited (SIGKILL)"
    assert "finished: error" in reply.figures


def test_figures_carry_the_prompt_and_its_cached_tokens() -> None:
    reply = Reply("p", "greedy", t_submit=1.0, t_first=1.1)
    finish(reply, Out("Paris.", [5, 6], "stop", list(range(40)), num_cached_tokens=32), 1.5)
    assert reply.cut is None and reply.state == "done"
    assert reply.figures.endswith("finished: stop · prompt 40 tokens, 32 cached")


def test_a_cached_count_nobody_measured_is_not_shown_as_zero() -> None:
    """A request the engine's death ended was ended by the client: its output's cached
    count is a default, not the engine's figure, and the line says nothing of it."""
    reply = Reply("p", "greedy", t_submit=1.0, t_first=1.1)
    finish(reply, Out("Par", [5], "error", list(range(40)), error="engine died"), 1.5)
    assert reply.figures.endswith("prompt 40 tokens"), reply.figures
    assert "cached" not in reply.figures
    measured = Reply("p", "greedy", t_submit=1.0, t_first=1.1)
    finish(measured, Out("Paris.", [5, 6], "stop", list(range(40))), 1.5)
    assert measured.figures.endswith("prompt 40 tokens, 0 cached")  # the engine said 0


class Engine:
    """A client stand-in: scripted stream pieces (None: a silent poll), aborts recorded."""

    def __init__(self, pieces: list[str | None], end: Out | None = None) -> None:
        self.pieces, self.end, self.aborted = list(pieces), end, []

    def stream(self, rid: str, timeout: float | None = None) -> Iterator[str]:
        while self.pieces:
            piece = self.pieces.pop(0)
            if piece is None:
                raise TimeoutError(f"request {rid} sent nothing within {timeout} s")
            yield piece

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    def result(self, rid: str, timeout: float | None = None) -> Out:
        if self.end is None:
            raise TimeoutError("not finished")
        return self.end


def test_silence_calls_waiting_and_the_stream_goes_on_after() -> None:
    engine = Engine(["a", "b", None, None, "c"])
    reply = Reply("p", "greedy", request_id="r1")
    waits: list[float] = []
    follow(engine, reply, lambda text: None, waits.append, poll_s=0.01)
    assert reply.text == "abc" and len(waits) == 2 and waits[0] <= waits[1]


def test_a_cut_reply_is_aborted_then_settled_with_the_engines_end() -> None:
    engine = Engine(["a", "b", "c"])
    reply = Reply("p", "greedy", request_id="r1", t_submit=1.0)

    def draw(text: str) -> None:
        if text == "ab":
            raise KeyboardInterrupt  # any exception a click raises inside a draw

    with pytest.raises(KeyboardInterrupt):
        try:
            follow(engine, reply, draw, lambda s: None)
        finally:
            interrupt(engine, reply, "stopped (Stop button)")
    assert engine.aborted == ["r1"] and reply.state == "cut" and reply.text == "ab"
    settle(engine, reply)  # the engine has not ended it yet: left as it is
    assert reply.state == "cut" and not reply.figures
    engine.end = Out("abc", [1, 2, 3], "abort")
    settle(engine, reply)
    assert reply.state == "done" and reply.cut == "stopped (Stop button)"
    assert "3 tokens" in reply.figures and "finished: abort" in reply.figures
