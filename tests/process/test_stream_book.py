"""A client's book of its requests keeps every request until its reader has taken its end:
thousands in flight lose no result, however many ended meanwhile."""

from __future__ import annotations

from engine.core.request import RequestOutput
from engine.process.streams import KEEP_FINISHED, StreamBook


def _end(book: StreamBook, rid: str) -> None:
    book.get(rid).finish(RequestOutput(rid, [1], [2], "x", "length"))


def test_ended_requests_stay_until_read_beyond_the_kept_count():
    book = StreamBook()
    n = 3 * KEEP_FINISHED
    for i in range(n):
        book.open(f"r{i}")
        if i >= 10:
            _end(book, f"r{i - 10}")  # ended, its reader not there yet
    missing = [i for i in range(n) if book.get(f"r{i}") is None]
    assert missing == [], f"{len(missing)} results lost, first {missing[:5]}"
    for i in range(n - 10):  # the readers come: each takes its end once
        items, out = book.get(f"r{i}").drain()
        assert out is not None and out.text == "x"
    for i in range(n, n + KEEP_FINISHED // 2):  # read ones are forgotten beyond the kept count
        book.open(f"r{i}")
    kept = sum(book.get(f"r{i}") is not None for i in range(n - 10))
    assert kept <= KEEP_FINISHED
