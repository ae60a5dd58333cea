"""What a client sees of the connection itself: an early 413 that a client still sending its
body reads (Python's urllib), an answer for a client that half-closes after its request,
malformed HTTP answered in OpenAI's error shape, one log line for a client that leaves
mid-body, no thread per open request, and (on a bare app, no engine) the cap on connections
and the cut-off for a client that stops reading."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import httpx
import pytest
import uvicorn
from serve_process import API_KEY, MODEL

from engine.serving import limits

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _address(server) -> tuple[str, int]:
    u = urlparse(server.url)
    return u.hostname, u.port


def _post_raw(body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
            ).encode() + raw


def _read_to_end(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def test_urllib_reads_an_early_413_with_its_message(server):
    body = b'{"prompt": "' + b"a" * (limits.MAX_BODY_BYTES + 1024) + b'"}'
    req = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                 headers={**AUTH, "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:  # not a connection reset
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 413
    assert "--max-body-bytes" in json.loads(e.value.read())["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_client_gets_its_answer(server, stream):
    with socket.create_connection(_address(server), timeout=60) as s:
        s.sendall(_post_raw({"model": MODEL, "prompt": "def f():", "max_tokens": 5,
                             "temperature": 0.0, "ignore_eos": True, "stream": stream}))
        s.shutdown(socket.SHUT_WR)  # as `nc -N` and some proxies do
        data = _read_to_end(s)
    head, _, body = data.rpartition(b"HTTP/1.1 ")[2].partition(b"\r\n\r\n")
    assert head.startswith(b"200"), data[:300]
    if stream:
        assert b"data: [DONE]" in body and body.count(b'"text"') >= 2
    else:
        assert json.loads(body)["usage"]["completion_tokens"] == 5


def test_malformed_http_gets_the_openai_error_body(server):
    with socket.create_connection(_address(server), timeout=30) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        data = _read_to_end(s)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head, data
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and "not valid HTTP" in error["message"]


def test_a_client_that_leaves_mid_body_is_one_log_line(server):
    start = len(server.output())
    with socket.create_connection(_address(server), timeout=30) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{API_KEY}\r\nContent-Length: 1000\r\n\r\n{{\"prompt\": \"ab".encode())
        time.sleep(0.5)
    deadline = time.monotonic() + 30
    while "the client left after sending" not in server.output()[start:]:
        assert time.monotonic() < deadline, server.output()[start:][-3000:]
        time.sleep(0.1)
    time.sleep(0.5)  # whatever else it would log comes with it
    logged = server.output()[start:]
    assert "Traceback" not in logged and "ClientDisconnect" not in logged, logged[-3000:]
    assert len([ln for ln in logged.splitlines() if "client left" in ln]) == 1


def _threads(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads")


def test_open_requests_hold_no_thread_each(server):
    before = _threads(server.proc.pid)
    n = 300
    most = [before]

    async def main() -> list[int]:
        body = {"model": MODEL, "prompt": "while True:", "max_tokens": 40, "stream": True,
                "temperature": 0.0, "ignore_eos": True}
        limits_ = httpx.Limits(max_connections=n + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, headers=AUTH, limits=limits_) as client:
            async def one() -> int:
                chunks = 0
                async with client.stream("POST", f"{server.url}/v1/completions",
                                         json=body) as r:
                    async for line in r.aiter_lines():
                        chunks += line.startswith("data: {")
                        most[0] = max(most[0], _threads(server.proc.pid))
                return chunks
            return await asyncio.gather(*(one() for _ in range(n)))

    chunks = asyncio.run(main())
    assert all(c >= 1 for c in chunks)
    print(f"\nserve threads: {before} idle, {most[0]} at most with {n} open streams")
    # The thread pool (submits, tokenization) is bounded; the streams take no thread each.
    assert most[0] - before < 60


# ------------------------------------------------------------- the connection rules alone
class _Bare:
    """uvicorn with the connection rules around a small ASGI app, on a thread: /hold answers
    after ``release`` is set, /flood streams until the client is gone."""

    def __init__(self, **rules: float) -> None:
        from engine.serving.protocol import with_rules
        from engine.serving.serve import bind

        self.release = threading.Event()
        self.flood_ended = threading.Event()

        async def app(scope, receive, send) -> None:
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            if scope["path"] == "/flood":  # as an event stream does, until a disconnect
                await receive()  # the request (no body)
                gone = asyncio.ensure_future(receive())
                while not gone.done():
                    await send({"type": "http.response.body", "body": b"x" * 65536,
                                "more_body": True})
                self.flood_ended.set()
                return
            while not self.release.is_set():
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b"ok"})

        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                    http=with_rules(**rules)))
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline
            time.sleep(0.02)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def stop(self) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def test_connections_beyond_the_cap_get_503_with_retry_after():
    bare = _Bare(max_connections=2)
    try:
        held = [bare.connect() for _ in range(2)]
        for s in held:
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        with bare.connect() as extra:
            extra.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            data = _read_to_end(extra)
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), data
        assert "--max-connections" in json.loads(body)["error"]["message"]
        bare.release.set()
        for s in held:  # the ones within the cap are answered
            assert _read_to_end_or_answer(s).startswith(b"HTTP/1.1 200")
            s.close()
    finally:
        bare.stop()


def _read_to_end_or_answer(s: socket.socket) -> bytes:
    data = b""
    while b"ok" not in data and (chunk := s.recv(65536)):
        data += chunk
    return data


def test_a_client_that_stops_reading_is_cut_off():
    bare = _Bare(write_timeout_s=1.0)
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", bare.port))
        s.sendall(b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n")
        # It reads nothing: the server's buffers fill, and the write deadline cuts it off.
        assert bare.flood_ended.wait(30), "the server still writes to a client that reads nothing"
        s.close()
    finally:
        bare.stop()
