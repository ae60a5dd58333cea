"""The HTTP/1.1 connection with a deadline for its request head.

Owns one rule uvicorn does not have: a request's line and headers must arrive within
``header_timeout_s`` of its first byte (or of the connection's opening). A client that
trickles a header a byte at a time, or opens connections and sends half a request, gets a
408 in OpenAI's error shape and the connection is closed, so idle sockets cannot pile up
(uvicorn's own keep-alive timeout only runs between two requests). The body's deadline is
limits.read_body's, on the event loop where the body is read. It must never parse bodies or
touch the engine.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # default --header-timeout


def timeout_response(message: str) -> bytes:
    """A complete 408 response that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": "request_timeout"}}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
            + body)


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on each request head (class attribute
    ``header_timeout_s``: make a subclass per setting with ``with_header_timeout``)."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        if self._waiting_for_head():
            self._arm()  # a new request's first bytes (after a keep-alive pause)
        super().data_received(data)
        if not self._waiting_for_head():
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._waiting_for_head():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written on this connection
        self.logger.info("closing a connection whose request head took over %g s",
                         self.header_timeout_s)
        self.transport.write(timeout_response(
            f"the request line and headers did not arrive within {self.header_timeout_s:g} s "
            "(--header-timeout)"))
        self.transport.close()


def with_header_timeout(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class for uvicorn.Config(http=...) with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,),
                {"header_timeout_s": float(seconds)})
