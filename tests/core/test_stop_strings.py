"""Stop strings: one automaton finds them where they first end, however the text is cut into
pieces and however many there are, and a request may carry only a bounded list of them."""

from __future__ import annotations

import random

import pytest

from engine.config import MAX_STOP_CHARS, MAX_STOP_STRINGS, SamplingParams
from engine.core.detokenizer import StopMatcher


def first_end(text: str, stop: list[str]) -> tuple[int, int] | None:
    """The reference: the earliest end of any stop string, the longest ending there."""
    for end in range(1, len(text) + 1):
        hits = [len(s) for s in stop if text[:end].endswith(s)]
        if hits:
            return end - 1, max(hits)
    return None


def test_matcher_finds_the_earliest_end_across_pieces():
    rng = random.Random(3)
    for _ in range(400):
        text = "".join(rng.choice("abc") for _ in range(rng.randrange(1, 30)))
        stop = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
                for _ in range(rng.randint(1, 5))]
        m = StopMatcher(stop)
        at, found = 0, None
        while at < len(text) and found is None:  # cut into random pieces
            piece = text[at : at + rng.randint(1, 5)]
            hit = m.feed(piece)
            if hit is not None:
                found = (at + hit[0], hit[1])
            at += len(piece)
        assert found == first_end(text, stop), (text, stop)


def test_a_stop_string_inside_another_is_found_where_it_ends():
    m = StopMatcher(["abcd", "bc"])
    assert m.feed("xab") is None
    assert m.feed("cd") == (0, 2)  # "bc" ends at the "c", before "abcd" could


@pytest.mark.parametrize("stop,message", [
    (["x"] * (MAX_STOP_STRINGS + 1), f"at most {MAX_STOP_STRINGS} are allowed"),
    (["x" * (MAX_STOP_CHARS + 1)], f"at most {MAX_STOP_CHARS} are allowed"),
])
def test_stop_lists_are_bounded(stop, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(stop=stop).validate()
    SamplingParams(stop=stop[:MAX_STOP_STRINGS] if len(stop) > 1
                   else [stop[0][:MAX_STOP_CHARS]]).validate()
