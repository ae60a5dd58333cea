"""A client's record of its own requests: what arrived for each, and waiting on it.

Owns RequestStream (one request's text deltas, token ids and end, as the session's receiver
thread delivers them), Follower (one request read from an event loop: the receiver thread
calls a wake function, nothing waits on a thread of its own) and StreamBook (a client's
requests by id: refusing an id still in use, keeping every request until its reader has
taken its end, forgetting the oldest taken ones, ending all of them when the engine is
gone). Waits here are sliced, so the caller's ``check`` can end them (a timeout, a silent
engine): nothing waits forever. No sockets, no threads of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from engine.core.request import RequestOutput

log = logging.getLogger("gapless.client")

KEEP_FINISHED = 1024  # ended requests, their end already taken, whose result() can be read
# Ended requests whose end nobody has taken yet are kept, up to this many: beyond it the
# oldest is dropped (a caller that submits and never reads would otherwise grow forever).
KEEP_UNREAD = 65536
POLL_S = 0.1  # how often a waiting caller runs its check


def next_item(q: queue.SimpleQueue[Any], check: Callable[[float], None]) -> Any:
    """The queue's next item, waited for in POLL_S slices; ``check(t0)`` runs between slices
    (t0: when this wait began) and raises to end the wait."""
    t0 = time.monotonic()
    while True:
        try:
            return q.get(timeout=POLL_S)
        except queue.Empty:
            check(t0)


class RequestStream:
    """One request's deltas and end."""

    __slots__ = ("request_id", "deltas", "done", "output", "text", "token_ids",
                 "prompt_token_ids", "taken", "wake")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        # (text, tokens so far) per delta, None at the end.
        self.deltas: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self.done = threading.Event()
        self.output: RequestOutput | None = None
        self.text = ""
        self.token_ids: list[int] = []
        # The prompt's ids when the client sent ids (HTTP always does): an end made on this
        # side (a dead engine) still reports them. A text prompt's ids exist only in the engine.
        self.prompt_token_ids: list[int] = []
        self.taken = False  # its reader has had the end (or stopped reading): may be dropped
        self.wake: Callable[[], None] | None = None  # a Follower's: told of every arrival

    def _arrived(self) -> None:
        wake = self.wake
        if wake is not None:
            wake()

    def add(self, text: str, token_ids: list[int]) -> None:
        self.text += text
        self.token_ids += token_ids
        self.deltas.put((text, len(self.token_ids)))
        self._arrived()

    def finish(self, output: RequestOutput) -> None:
        """The first end wins."""
        if self.done.is_set():
            return
        self.output = output
        self.done.set()
        self.deltas.put(None)
        self._arrived()

    def end_here(self, reason: str, error: str) -> None:
        """End it on this side, keeping what arrived (the engine is gone or gave no answer)."""
        self.finish(RequestOutput(self.request_id, list(self.prompt_token_ids),
                                  list(self.token_ids), self.text, reason, error))

    def iter_deltas(self, check: Callable[[float], None]) -> Iterator[str]:
        """Text deltas until the end; ``check(t0)`` runs every POLL_S while waiting (t0: when
        this wait began) and raises to end the wait."""
        for text, _ in self.iter_counted(check):
            yield text

    def iter_counted(self, check: Callable[[float], None]) -> Iterator[tuple[str, int]]:
        """(text delta, output tokens so far, this delta's included) until the end."""
        while (delta := next_item(self.deltas, check)) is not None:
            yield delta
        self.deltas.put(None)  # a second iteration ends at once too
        self.taken = True

    def wait(self, check: Callable[[float], None]) -> RequestOutput:
        t0 = time.monotonic()
        while not self.done.wait(POLL_S):
            check(t0)
        assert self.output is not None
        self.taken = True
        return self.output

    def drain(self) -> tuple[list[tuple[str, int]], RequestOutput | None]:
        """What has arrived, without waiting: the deltas, and the output once the end has."""
        items: list[tuple[str, int]] = []
        while True:
            try:
                delta = self.deltas.get_nowait()
            except queue.Empty:
                return items, None
            if delta is None:
                self.deltas.put(None)  # a later drain or iteration ends at once too
                self.taken = True
                return items, self.output
            items.append(delta)


class Follower:
    """One request read from an event loop: ``wake`` (given to EngineClient.follow) is called
    on the session's receiver thread whenever something arrives, and the loop takes what
    came with take(). close() when the reader stops, at the end or early."""

    __slots__ = ("stream", "_check")

    def __init__(self, stream: RequestStream, wake: Callable[[], None],
                 check: Callable[[float], None]) -> None:
        self.stream = stream
        self._check = check
        stream.wake = wake
        wake()  # what arrived before this follower did

    def take(self) -> tuple[list[tuple[str, int]], RequestOutput | None]:
        """The (text, output tokens so far) deltas that arrived, and the output at the end."""
        return self.stream.drain()

    def check(self, t0: float) -> None:
        """Raises (EngineNotResponding) once the engine has been silent for the client's
        give_up_after_s; ``t0``: when the wait for the next item began."""
        self._check(t0)

    def close(self) -> None:
        self.stream.wake = None
        self.stream.taken = True


class StreamBook:
    """One session's requests by id (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._streams: OrderedDict[str, RequestStream] = OrderedDict()
        self._prune_at = KEEP_FINISHED  # look for streams to drop once there are this many

    def get(self, request_id: str) -> RequestStream | None:
        return self._streams.get(request_id)

    def open(self, request_id: str) -> RequestStream:
        """A new stream; ValueError while a request of that id has not ended."""
        stream = RequestStream(request_id)
        with self.lock:
            old = self._streams.get(request_id)
            if old is not None and not old.done.is_set():
                raise ValueError(f"request id {request_id!r} is already in use")
            self._streams[request_id] = stream
            self._streams.move_to_end(request_id)
            self._forget_old()
        return stream

    def _forget_old(self) -> None:
        """Drop the oldest ended streams whose end was taken beyond KEEP_FINISHED, and the
        oldest never taken beyond KEEP_UNREAD. Streams still running are never dropped."""
        if len(self._streams) <= self._prune_at:
            return
        ended = [(rid, s) for rid, s in self._streams.items() if s.done.is_set()]
        taken = [rid for rid, s in ended if s.taken]
        unread = [rid for rid, s in ended if not s.taken]
        for rid in taken[:max(0, len(taken) - KEEP_FINISHED)]:
            del self._streams[rid]
        extra = len(unread) - KEEP_UNREAD
        if extra > 0:
            log.warning("dropping the %d oldest ended requests nobody read (more than %d "
                        "unread)", extra, KEEP_UNREAD)
            for rid in unread[:extra]:
                del self._streams[rid]
        # Many requests running: look again after a quarter of KEEP_FINISHED more opens.
        self._prune_at = max(KEEP_FINISHED, len(self._streams) + KEEP_FINISHED // 4)

    def forget(self, stream: RequestStream) -> None:
        """Drop a stream whose request never reached the engine."""
        with self.lock:
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]

    def open_ids(self) -> list[str]:
        """The ids of the requests not ended yet."""
        with self.lock:
            return [rid for rid, s in self._streams.items() if not s.done.is_set()]

    def end_all(self, reason: str) -> None:
        with self.lock:
            streams = list(self._streams.values())
        for s in streams:
            s.end_here("error", reason)

    def adopt(self, other: StreamBook) -> None:
        """Keep another (ended) session's requests readable here."""
        with other.lock:
            items = list(other._streams.items())
        with self.lock:
            for rid, stream in items:
                self._streams.setdefault(rid, stream)
