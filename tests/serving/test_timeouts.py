"""Slow and malformed clients: a request head that trickles in, a body that never
arrives (a declared Content-Length never sent), fifty trickling connections at once, and
conflicting framing are each answered (408, 400) and closed within the server's deadlines
(the session server runs with --header-timeout and --body-timeout of a few seconds), and the
server serves on."""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlparse

import httpx
from serve_process import API_KEY, BODY_TIMEOUT_S, HEADER_TIMEOUT_S, MODEL

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SLACK_S = 5.0  # scheduling on a loaded 2-core machine


def _connect(server) -> socket.socket:
    u = urlparse(server.url)
    s = socket.create_connection((u.hostname, u.port), timeout=HEADER_TIMEOUT_S + 30)
    return s


def _read_all(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def test_trickling_head_gets_408_and_is_closed(server):
    s = _connect(server)
    t0 = time.monotonic()
    stop = threading.Event()

    def trickle() -> None:
        for b in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
            if stop.is_set():
                return
            try:
                s.send(bytes([b]))
            except OSError:
                return
            time.sleep(0.2)

    threading.Thread(target=trickle, daemon=True).start()
    data = _read_all(s)
    stop.set()
    waited = time.monotonic() - t0
    s.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"--header-timeout" in data and b"request_timeout" in data
    assert HEADER_TIMEOUT_S - 0.5 < waited < HEADER_TIMEOUT_S + SLACK_S


def test_declared_body_that_never_arrives_gets_408(server):
    s = _connect(server)
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n").encode()
    t0 = time.monotonic()
    s.sendall(head + b'{"prompt": "')
    data = _read_all(s)
    waited = time.monotonic() - t0
    s.close()
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"--body-timeout" in data and b"connection: close" in data.lower()
    assert BODY_TIMEOUT_S - 0.5 < waited < BODY_TIMEOUT_S + SLACK_S


def test_fifty_trickling_connections_are_all_closed(server):
    socks = [_connect(server) for _ in range(50)]
    for s in socks:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    # Meanwhile the server answers others.
    r = httpx.get(f"{server.url}/health", timeout=30)
    assert r.status_code == 200
    t0 = time.monotonic()
    answers = [_read_all(s) for s in socks]
    for s in socks:
        s.close()
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
    assert time.monotonic() - t0 < HEADER_TIMEOUT_S + SLACK_S


def test_conflicting_framing_refused_with_400(server):
    s = _connect(server)
    body = b'{"prompt": "x", "max_tokens": 1}'
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}"
               f"\r\nContent-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n\r\n"
               ).encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    data = _read_all(s)
    s.close()
    assert data.startswith(b"HTTP/1.1 400"), data[:200]


def test_keep_alive_connection_serves_a_second_request(server):
    # The head deadline restarts per request: a pause between two requests on one
    # connection (shorter than the keep-alive timeout) does not trip it.
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        assert http.get("/health").status_code == 200
        time.sleep(1.0)
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200, r.text
