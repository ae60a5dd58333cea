"""Ring buffer: sequence numbers, overflow, slow readers, and a writer/reader race."""

from __future__ import annotations

import threading

import pytest

from telemetry.ring import Ring


def test_read_everything_then_nothing_new() -> None:
    ring: Ring[int] = Ring(8)
    for i in range(5):
        assert ring.append(i * 10) == i
    items, cursor, missed = ring.read_since(0)
    assert (items, cursor, missed) == ([0, 10, 20, 30, 40], 5, 0)
    assert ring.read_since(cursor) == ([], 5, 0)


def test_overflow_drops_oldest_and_counts() -> None:
    ring: Ring[int] = Ring(4)
    for i in range(10):
        ring.append(i)
    assert len(ring) == 4
    assert ring.head == 10
    assert ring.oldest == 6
    assert ring.dropped == 6
    assert ring.read_since(0) == ([6, 7, 8, 9], 10, 6)


def test_slow_reader_missed_is_exact() -> None:
    ring: Ring[int] = Ring(4)
    for i in range(3):
        ring.append(i)
    items, cursor, missed = ring.read_since(0)
    assert (items, cursor, missed) == ([0, 1, 2], 3, 0)
    for i in range(3, 10):  # 7 more: seqs 3, 4, 5 are overwritten before the reader returns
        ring.append(i)
    assert ring.read_since(cursor) == ([6, 7, 8, 9], 10, 3)


def test_max_items_takes_oldest_and_leaves_the_rest() -> None:
    ring: Ring[int] = Ring(6)
    for i in range(9):  # holds 3..8
        ring.append(i)
    assert ring.read_since(0, max_items=2) == ([3, 4], 5, 3)
    assert ring.read_since(5, max_items=2) == ([5, 6], 7, 0)
    assert ring.read_since(7, max_items=10) == ([7, 8], 9, 0)
    assert ring.read_since(9, max_items=0) == ([], 9, 0)


def test_wraparound_slices_and_last() -> None:
    ring: Ring[str] = Ring(5)
    for ch in "abcdefg":  # holds c..g, physically [f, g, c, d, e]
        ring.append(ch)
    assert ring.last(3) == ["e", "f", "g"]
    assert ring.last(10) == ["c", "d", "e", "f", "g"]
    assert ring.last(0) == []
    assert ring.read_since(3) == (["d", "e", "f", "g"], 7, 0)
    assert ring.read_since(2) == (["c", "d", "e", "f", "g"], 7, 0)


def test_full_capacity_read_after_exact_multiple() -> None:
    ring: Ring[int] = Ring(3)
    for i in range(6):  # head is a multiple of capacity: start and end index coincide
        ring.append(i)
    assert ring.read_since(3) == ([3, 4, 5], 6, 0)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Ring(0)
    ring: Ring[int] = Ring(2)
    ring.append(1)
    with pytest.raises(ValueError, match="ahead"):
        ring.read_since(2)
    with pytest.raises(ValueError, match="cursor"):
        ring.read_since(-1)
    with pytest.raises(ValueError, match="max_items"):
        ring.read_since(0, max_items=-1)


def test_concurrent_writer_and_readers_lose_nothing_unaccounted() -> None:
    total = 200_000
    ring: Ring[int] = Ring(64)
    done = threading.Event()
    errors: list[BaseException] = []
    results: list[tuple[int, int, int]] = []  # (received, missed, final cursor) per reader

    def writer() -> None:
        for i in range(total):
            ring.append(i)  # item value == its sequence number
        done.set()

    def reader() -> None:
        try:
            cursor = received = missed_total = 0
            while True:
                finished = done.is_set()
                items, new_cursor, missed = ring.read_since(cursor, max_items=50)
                # What came back is exactly the consecutive run ending at new_cursor.
                assert items == list(range(new_cursor - len(items), new_cursor))
                assert new_cursor - len(items) == cursor + missed
                received += len(items)
                missed_total += missed
                cursor = new_cursor
                if finished and cursor == ring.head:
                    break
            results.append((received, missed_total, cursor))
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(results) == 3
    for received, missed, cursor in results:
        assert cursor == total
        assert received + missed == total
    assert ring.dropped == total - 64
