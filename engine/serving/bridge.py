"""One engine request seen from asyncio: submit, its text deltas, its end, its abort.

Owns the crossing from EngineClient to the HTTP server's event loop, which must never block
on a pipe round-trip or a queue wait. The submit (a round-trip the engine answers) runs in
the thread pool; after it, the request is read through EngineClient.follow: the client's
receiver thread wakes the loop when something arrives and the loop takes it, so an open
request holds no thread (thousands may be in flight). Abort is a message the client queues
without waiting, so it is sent from the loop. It must never hold an engine call on the
event loop thread, and never leave a request running in the engine once its HTTP client has
gone: whoever owns an EngineRequest calls abort() when it stops reading early.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from engine.config import SamplingParams
from engine.core.request import RequestOutput

# How long a reader waits for the next delta before it asks whether the engine is silent
# past the client's give_up_after_s.
CHECK_EVERY_S = 1.0


class EngineRequest:
    """A submitted request. Iterate deltas() once; then ``output`` is its RequestOutput."""

    def __init__(self, client: Any, request_id: str, prompt_len: int) -> None:
        self.client = client
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.output: RequestOutput | None = None
        self.num_tokens = 0  # output tokens so far, as of the last delta deltas() gave
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._wake_sent = False
        self._follower = client.follow(request_id, self._wake)

    @classmethod
    async def submit(cls, client: Any, prompt_ids: list[int], params: SamplingParams,
                     request_id: str) -> EngineRequest:
        """Queue the request in the engine. ValueError / EngineDead / TimeoutError from
        client.submit pass through."""
        await run_in_threadpool(client.submit, prompt_ids, params, request_id)
        return cls(client, request_id, len(prompt_ids))

    def _wake(self) -> None:
        """On the client's receiver thread: schedule one wake-up of the reader (one pending
        at a time, however many deltas arrive before it runs)."""
        if self._wake_sent:
            return
        self._wake_sent = True
        try:
            self._loop.call_soon_threadsafe(self._arrived.set)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    @property
    def finished(self) -> bool:
        return self.output is not None

    async def deltas(self) -> AsyncIterator[str]:
        """Text as it comes; deltas already waiting are joined into one (fewer chunks for
        a client that reads slower than the engine writes), ``num_tokens`` then counting the
        output tokens up to the end of that text (where the client tells it). Ends when the
        request does; raises EngineNotResponding once the engine has been silent for the
        client's give_up_after_s."""
        t0 = time.monotonic()
        try:
            while self.output is None:
                self._arrived.clear()
                self._wake_sent = False  # from here on, an arrival schedules a wake-up
                items, out = self._follower.take()
                if items:
                    self.num_tokens = items[-1][1]
                if out is not None:
                    self.num_tokens = len(out.token_ids)
                    self.output = out
                text = "".join(t for t, _ in items)
                if text:
                    yield text
                if items or out is not None:
                    t0 = time.monotonic()
                    continue
                try:
                    async with asyncio.timeout(CHECK_EVERY_S):
                        await self._arrived.wait()
                except TimeoutError:
                    self._follower.check(t0)
        finally:
            self._follower.close()

    async def result(self) -> RequestOutput:
        async for _ in self.deltas():
            pass
        assert self.output is not None
        return self.output

    async def abort(self) -> None:
        """Abort in the engine unless it has ended (the client queues the message and
        returns at once); safe to call from a cancelled task."""
        self._follower.close()
        if self.output is not None:
            return
        try:
            self.client.abort(self.request_id)
        except Exception:  # dead engine: nothing left to free
            pass
