"""The HTTP/1.1 connection rules uvicorn does not have: deadlines, a cap, closing politely.

Owns, per connection (a subclass of uvicorn's h11 protocol):
- a deadline for each request head: its line and headers must arrive within
  ``header_timeout_s`` of its first byte (or of the connection's opening), else 408 and the
  connection is closed, so idle sockets cannot pile up (uvicorn's keep-alive timeout only
  runs between two requests); the body's deadline is limits.read_body's;
- a deadline for writes: a client that stops reading (its socket's buffers full) for
  ``write_timeout_s`` is cut off, so its stream is aborted instead of holding the connection
  and its request forever;
- a cap on connections: beyond ``max_connections`` a new one is answered 503 with
  Retry-After and closed, before it is read;
- a lingering close (RFC 9112 section 9.6): when the server closes, it first sends what it
  has, shuts its side, then reads and discards what the client still sends (up to
  LINGER_MAX_BYTES, for up to LINGER_S) before closing, so a client that sends its whole body
  before reading (Python's urllib, some proxies) reads the early 413 instead of a reset;
- a half-closed client (shutdown(SHUT_WR) after its request, as `nc -N` and some proxies do)
  still gets its answer: the end of its input means it has nothing more to send, not that it
  left (the HTTP working group's reading, which Hypercorn follows); the connection closes
  after that answer. A client that closed altogether sends the same end of input: to tell
  them apart, the server sends what every client skips (an interim "100 Continue" before the
  answer has begun, an event-stream comment in a stream: the app marks streams with
  SSE_SCOPE_KEY) and watches the socket every PROBE_S: a client that is gone answers with a
  reset, and its request is aborted as any other that loses its client;
- malformed HTTP answered in OpenAI's error shape (400 JSON), not plain text.
It must never parse bodies or touch the engine.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # default --header-timeout
# A head timer that fires this much after its time says the event loop, not the client, was
# slow: the deadline starts again instead of answering 408.
LATE_TIMER_S = 0.5
WRITE_TIMEOUT_S = 30.0  # default --write-timeout
MAX_CONNECTIONS = 8192  # default --max-connections
LINGER_S = 5.0  # a lingering close reads what the client still sends for this long at most
LINGER_MAX_BYTES = 64 * 2**20  # ... and this much at most
RETRY_AFTER_S = 1
SSE_SCOPE_KEY = "gapless.event_stream"  # set in the ASGI scope by a server-sent-event answer
PROBE_S = 0.5  # how often a half-closed connection's socket is looked at
PROBE_FIRST_S = 0.02  # the first look: a closed client's reset comes back within a round trip
TCP_CLOSE = 7  # tcpi_state of a socket the peer has reset


def error_body(message: str, code: str | None, type: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": type, "param": None,
                                 "code": code}}).encode()


def error_response(status: int, reason: str, message: str, code: str | None,
                   type: str = "invalid_request_error",
                   headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete response in OpenAI's error shape that closes the connection."""
    body = error_body(message, code, type)
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
            "connection: close", f"content-length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def timeout_response(message: str) -> bytes:
    """A complete 408 response that closes the connection."""
    return error_response(408, "Request Timeout", message, "request_timeout")


class _Transport:
    """The connection's transport as uvicorn sees it: close() is a lingering close."""

    def __init__(self, transport: asyncio.Transport, protocol: ConnectionRules) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._protocol.linger()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class ConnectionRules(H11Protocol):
    """uvicorn's h11 protocol with this module's rules (class attributes: make a subclass
    per setting with ``with_rules``)."""

    header_timeout_s = HEADER_TIMEOUT_S
    write_timeout_s = WRITE_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.raw_transport = transport
        self.lingering = False
        self._input_ended = False
        self._discarded = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None
        super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self.logger.warning("refusing a connection: %d are open, the most this server "
                                "keeps (--max-connections)", len(self.connections) - 1)
            transport.write(error_response(
                503, "Service Unavailable", f"the server is busy: it keeps at most "
                f"{self.max_connections} connections open (--max-connections); retry "
                "shortly", "server_busy", "server_error",
                (("retry-after", str(RETRY_AFTER_S)),)))
            self.linger()
            return
        self._arm_head()

    # ------------------------------------------------------------------ request heads
    def _arm_head(self) -> None:
        if self._head_timer is None and not self.lingering:
            self._head_due = self.loop.time() + self.header_timeout_s
            self._head_timer = self.loop.call_at(self._head_due, self._head_late)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._discarded += len(data)
            if self._discarded > LINGER_MAX_BYTES:
                self.raw_transport.abort()
            return
        if self._waiting_for_head():
            self._arm_head()  # a new request's first bytes (after a keep-alive pause)
        super().data_received(data)
        if not self._waiting_for_head():
            self._disarm_head()

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._waiting_for_head():
            return
        if self.loop.time() - self._head_due > LATE_TIMER_S:
            # The timer itself ran late: this server's loop was busy (a burst of connections,
            # a loaded machine), so the head may be waiting unread. The server was slow, not
            # the client: give the client a fresh period.
            self._arm_head()
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a response is still being written on this connection
        self.logger.info("closing a connection whose request head took over %g s",
                         self.header_timeout_s)
        self.raw_transport.write(timeout_response(
            f"the request line and headers did not arrive within {self.header_timeout_s:g} s "
            "(--header-timeout)"))
        self.linger()

    def send_400_response(self, msg: str) -> None:
        """Malformed HTTP: 400 in OpenAI's error shape, then the connection closes."""
        body = error_body(f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})",
                          "invalid_http")
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.raw_transport.write(self.conn.send(event))
        self.linger()

    # ------------------------------------------------------------------------ writes
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout_s, self._write_late)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        self._write_timer = None
        self.logger.info("cutting off a client that read nothing for %g s (--write-timeout)",
                         self.write_timeout_s)
        self.raw_transport.abort()  # connection_lost: its request is aborted

    # ------------------------------------------------------------------------ ending
    def eof_received(self) -> bool | None:
        """The client shut its side. With its request all received it still gets the answer
        (then the connection closes); otherwise it has left."""
        self._input_ended = True
        if self.lingering:
            return None  # close now
        cycle = self.cycle
        if (cycle is not None and not cycle.response_complete
                and self.conn.their_state in (h11.DONE, h11.MUST_CLOSE)):
            cycle.keep_alive = False
            self._probe()
            return True  # keep the connection open for the answer
        return None

    def _probe(self) -> None:
        """Make a client that closed altogether reset the connection (an interim 100 before
        the answer has begun), then watch the socket for that reset."""
        sock = self.raw_transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        try:
            if not self.cycle.response_started and self.conn.their_http_version == b"1.1":
                self.raw_transport.write(self.conn.send(
                    h11.InformationalResponse(status_code=100, headers=[],
                                             reason=b"Continue")))
            elif self.scope.get(SSE_SCOPE_KEY) and self.conn.our_state is h11.SEND_BODY:
                self.raw_transport.write(self.conn.send(h11.Data(data=b":\n\n")))
        except h11.LocalProtocolError:
            pass
        self._probe_timer = self.loop.call_later(PROBE_FIRST_S, self._check_reset, sock)

    def _check_reset(self, sock: Any) -> None:
        self._probe_timer = None
        if self.raw_transport.is_closing() or self.cycle is None \
                or self.cycle.response_complete:
            return
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        except OSError:
            return
        if state == TCP_CLOSE:
            self.logger.info("a half-closed client reset its connection: it is gone")
            self.raw_transport.abort()  # connection_lost: its request is aborted
            return
        self._probe_timer = self.loop.call_later(PROBE_S, self._check_reset, sock)

    def linger(self) -> None:
        """Close politely: send what is queued, shut this side, read and discard what the
        client still sends (LINGER_S, LINGER_MAX_BYTES at most), then close."""
        t = self.raw_transport
        if self.lingering or t.is_closing():
            return
        self.lingering = True
        self._disarm_head()
        if self._input_ended or not t.can_write_eof():
            t.close()
            return
        try:
            t.write_eof()
        except OSError:
            t.close()
            return
        t.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, t.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        for timer in (self._write_timer, self._linger_timer, self._probe_timer):
            if timer is not None:
                timer.cancel()
        self._write_timer = self._linger_timer = self._probe_timer = None
        super().connection_lost(exc)


def with_rules(header_timeout_s: float = HEADER_TIMEOUT_S,
               write_timeout_s: float = WRITE_TIMEOUT_S,
               max_connections: int = MAX_CONNECTIONS) -> type[ConnectionRules]:
    """The protocol class for uvicorn.Config(http=...) with these settings."""
    return type("ConnectionRules", (ConnectionRules,), {
        "header_timeout_s": float(header_timeout_s), "write_timeout_s": float(write_timeout_s),
        "max_connections": int(max_connections)})
