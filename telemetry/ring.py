"""A bounded ring buffer with sequence numbers and per-reader cursors.

Owns the storage discipline of the telemetry bus: one writer (the engine thread) appends in
O(1) and never blocks on a reader; when the ring is full the oldest item is overwritten and
counted as dropped. Readers keep their own cursor (the sequence number of the next item they
want) and learn exactly how many items they missed because they read too slowly.

It must never block the writer for longer than a list store under a lock, never copy the
buffer on append, and never know what the items are.
"""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

T = TypeVar("T")


class Ring(Generic[T]):
    """Fixed-capacity ring. Item number ``seq`` (0, 1, 2, ...) lives at ``seq % capacity``.

    Sequence numbers never repeat, so a cursor stays meaningful forever: items with
    ``seq < oldest`` were overwritten, items with ``oldest <= seq < head`` can be read.
    """

    __slots__ = ("_buf", "_capacity", "_head", "_lock")

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"ring capacity must be a positive int, got {capacity!r}")
        self._capacity = capacity
        self._buf: list[T | None] = [None] * capacity
        self._head = 0  # sequence number the next append gets == total appended
        # A plain Lock: appends hold it for one store and one add, readers for one slice.
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def head(self) -> int:
        """Sequence number of the next item to be appended (= number ever appended)."""
        return self._head

    @property
    def oldest(self) -> int:
        """Sequence number of the oldest item still held."""
        return max(0, self._head - self._capacity)

    @property
    def dropped(self) -> int:
        """Items overwritten before anyone could be sure to read them (ring-wide)."""
        return max(0, self._head - self._capacity)

    def __len__(self) -> int:
        return min(self._head, self._capacity)

    def append(self, item: T) -> int:
        """Store ``item``, overwriting the oldest when full. Returns its sequence number."""
        with self._lock:
            seq = self._head
            self._buf[seq % self._capacity] = item
            self._head = seq + 1
        return seq

    def read_since(self, cursor: int, max_items: int | None = None) -> tuple[list[T], int, int]:
        """Items with sequence numbers from ``cursor`` on, oldest first.

        Returns ``(items, new_cursor, missed)``: pass ``new_cursor`` to the next call;
        ``missed`` counts items this reader never saw because they were overwritten before
        this call. At most ``max_items`` items are returned (the oldest ones); the rest stay
        for the next call.
        """
        if cursor < 0:
            raise ValueError(f"cursor must be >= 0, got {cursor}")
        if max_items is not None and max_items < 0:
            raise ValueError(f"max_items must be >= 0 or None, got {max_items}")
        with self._lock:
            head = self._head
            if cursor > head:
                raise ValueError(f"cursor {cursor} is ahead of the ring's head {head}")
            oldest = max(0, head - self._capacity)
            missed = oldest - cursor if cursor < oldest else 0
            start = cursor + missed
            end = head if max_items is None else min(head, start + max_items)
            items = self._slice(start, end)
        return items, end, missed

    def last(self, n: int) -> list[T]:
        """The newest ``min(n, len(self))`` items, oldest first."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            head = self._head
            start = max(head - min(n, self._capacity), 0)
            return self._slice(start, head)

    def _slice(self, start: int, end: int) -> list[T]:
        # Caller holds the lock. At most two contiguous list slices: no per-item Python loop.
        if end <= start:
            return []
        cap = self._capacity
        i, j = start % cap, end % cap
        if i < j:
            out = self._buf[i:j]
        else:
            out = self._buf[i:] + self._buf[:j]
        return out  # type: ignore[return-value]  # every slot in [start, end) is filled
