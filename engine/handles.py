"""Request handles and the sink that feeds them: how a request's text and end reach callers.

Owns `RequestHandle` (iterate it for text deltas, `result()` for the end), the registry of
open requests by id (an id is in use from submit until its end has been delivered, and free
again at once after), and running the caller's callbacks on the engine's loop thread, where
a callback that raises anything, SystemExit included, fails its own request and never the
loop. Never touches the scheduler or a device.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

from engine.core.request import Request, RequestOutput
from engine.step.loop import RequestFault, RequestSink, describe

log = logging.getLogger("gapless.engine")

DeltaCallback = Callable[[str, str], None]
FinishCallback = Callable[[RequestOutput], None]


class RequestHandle:
    """Returned by submit(). Iterate it for text deltas; result() waits for the end."""

    def __init__(self, request_id: str, on_delta: DeltaCallback | None = None,
                 on_finish: FinishCallback | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids: list[int] = []  # set by submit() once the prompt is tokenized
        self.on_delta = on_delta
        self.on_finish = on_finish
        self._deltas: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._done = threading.Event()
        self._output: RequestOutput | None = None

    def __iter__(self) -> Iterator[str]:
        while True:
            d = self._deltas.get()
            if d is None:
                return
            yield d

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish in {timeout} s")
        assert self._output is not None
        return self._output

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def push_delta(self, text: str) -> None:
        """Hand a piece of text to iterating callers (the sink's job)."""
        self._deltas.put(text)

    def complete(self, output: RequestOutput) -> None:
        """Deliver the end: result() returns, iteration stops. Once."""
        self._output = output
        self._deltas.put(None)
        self._done.set()


class HandleSink(RequestSink):
    """The engine's RequestSink: open requests by id, each with its handle."""

    def __init__(self) -> None:
        self.open: dict[str, tuple[Request, RequestHandle]] = {}

    @property
    def num_open(self) -> int:
        return len(self.open)

    def request(self, request_id: str) -> Request | None:
        entry = self.open.get(request_id)
        return entry[0] if entry is not None else None

    def on_delta(self, req: Request, text: str) -> None:
        entry = self.open.get(req.request_id)
        if entry is None or entry[0] is not req:
            return
        h = entry[1]
        h.push_delta(text)
        if h.on_delta is not None:
            try:
                h.on_delta(req.request_id, text)
            except BaseException as e:  # SystemExit too: it must not end the loop thread
                raise RequestFault(f"the on_delta callback raised {describe(e)}") from e

    def on_finish(self, req: Request) -> None:
        entry = self.open.get(req.request_id)
        if entry is None or entry[0] is not req:
            return
        del self.open[req.request_id]  # the id is free again from here on
        h = entry[1]
        out = output_of(req)
        h.complete(out)
        if h.on_finish is not None:
            try:
                h.on_finish(out)
            except BaseException:  # the request has ended; nothing else to fail
                log.exception("on_finish callback of request %s raised", req.request_id)

    def fail_open(self, message: str) -> None:
        """The loop is gone: end every open request with "error" and `message`, without the
        scheduler (its state is no longer trusted)."""
        for rid in list(self.open):
            entry = self.open.pop(rid, None)
            if entry is None:
                continue
            req, h = entry
            req.error = req.error or message
            req.finish_reason = "error"
            h.complete(output_of(req))


def output_of(req: Request) -> RequestOutput:
    metrics: dict[str, float] = {}
    if req.first_token_ns is not None:
        metrics["ttft_s"] = (req.first_token_ns - req.arrival_ns) / 1e9
    if req.finished_ns is not None:
        metrics["e2e_s"] = (req.finished_ns - req.arrival_ns) / 1e9
        if req.first_token_ns is not None and len(req.output_token_ids) > 1:
            decode_s = (req.finished_ns - req.first_token_ns) / 1e9
            metrics["decode_tokens_per_s"] = (len(req.output_token_ids) - 1) / max(decode_s, 1e-9)
    return RequestOutput(req.request_id, list(req.prompt_token_ids), list(req.output_token_ids),
                         req.text, req.finish_reason, req.error, metrics,
                         req.num_cached_tokens)
