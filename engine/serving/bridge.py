"""One engine request seen from asyncio: submit, its text deltas, its end, its abort.

Owns the crossing from EngineClient's blocking calls (submit, stream, result, abort: pipe
round-trips and queue waits) to the HTTP server's event loop, which must never block on
them. Short calls run in the thread pool; each request's stream is drained by one daemon
thread that hands deltas to the loop with call_soon_threadsafe (a pool worker per open
stream would cap the streams at the pool's size). It must never hold an engine call on the
event loop thread, and never leave a request running in the engine once its HTTP client
has gone: whoever owns an EngineRequest calls abort() when it stops reading early.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.concurrency import run_in_threadpool

from engine.config import SamplingParams
from engine.core.request import RequestOutput


class EngineRequest:
    """A submitted request. Iterate deltas() once; then ``output`` is its RequestOutput."""

    def __init__(self, client: Any, request_id: str, prompt_len: int) -> None:
        self.client = client
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.output: RequestOutput | None = None
        self.num_tokens = 0  # output tokens so far, as of the last delta deltas() gave
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        threading.Thread(target=self._pump, daemon=True,
                         name=f"gapless-http-{request_id}").start()

    @classmethod
    async def submit(cls, client: Any, prompt_ids: list[int], params: SamplingParams,
                     request_id: str) -> EngineRequest:
        """Queue the request in the engine. ValueError / EngineDead / TimeoutError from
        client.submit pass through."""
        await run_in_threadpool(client.submit, prompt_ids, params, request_id)
        return cls(client, request_id, len(prompt_ids))

    def _put(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    def _pump(self) -> None:
        try:
            counted = getattr(self.client, "stream_counted", None)  # EngineClient has it
            if counted is not None:
                for delta in counted(self.request_id):
                    self._put(delta)
            else:
                for text in self.client.stream(self.request_id):
                    self._put(text)
            self._put(self.client.result(self.request_id))
        except BaseException as e:  # handed to the reader, who raises it
            self._put(e)

    @property
    def finished(self) -> bool:
        return self.output is not None

    async def deltas(self) -> AsyncIterator[str]:
        """Text as it comes; deltas already waiting are joined into one (fewer chunks for
        a client that reads slower than the engine writes), ``num_tokens`` then counting the
        output tokens up to the end of that text (where the client tells it). Ends when the
        request does."""
        while self.output is None:
            item = await self._queue.get()
            text = ""
            while True:
                if isinstance(item, tuple):
                    text += item[0]
                    self.num_tokens = item[1]
                elif isinstance(item, str):
                    text += item
                elif isinstance(item, RequestOutput):
                    self.num_tokens = len(item.token_ids)
                    self.output = item
                    break
                else:
                    raise item
                if self._queue.empty():
                    break
                item = self._queue.get_nowait()
            if text:
                yield text

    async def result(self) -> RequestOutput:
        async for _ in self.deltas():
            pass
        assert self.output is not None
        return self.output

    async def abort(self) -> None:
        """Abort in the engine unless it has ended; safe to call from a cancelled task."""
        if self.output is not None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await run_in_threadpool(self.client.abort, self.request_id)
            except Exception:  # dead engine: nothing left to free
                pass
