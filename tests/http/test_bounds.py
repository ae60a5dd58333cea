"""Bounds before work (issue 21): a body over the limit, a declared absurd Content-Length,
conflicting framing, JSON nested too deep and a prompt of too many characters are each
refused with a 4xx in OpenAI's error shape, and the server serves on afterwards."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import httpx
import pytest
from serving import API_KEY, MODEL

from engine.serving import limits

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _raw(server, request: bytes) -> bytes:
    u = urlparse(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)  # half-closed: the answer must still come
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def test_big_body_refused_with_413(server):
    body = b'{"model": "%s", "prompt": "' % MODEL.encode() + b"x" * (
        limits.MAX_BODY_BYTES + 10) + b'"}'
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert "--max-body-bytes" in r.json()["error"]["message"]


def test_absurd_declared_length_refused_before_the_body(server):
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n").encode()
    data = _raw(server, head + b'{"prompt":')
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


def test_nested_json_gets_400_not_500(server):
    body = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={**AUTH, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"


def test_prompt_of_too_many_characters_refused_before_tokenizing(server):
    prompt = "a " * (1024 * limits.CHARS_PER_TOKEN_BOUND)
    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt"


def test_server_serves_on_after_refusals(server):
    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=60,
                   json={"model": MODEL, "prompt": "def f():", "max_tokens": 2})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [b"{" * 65 + b"}" * 65, b'"' + b"[" * 200 + b'"'])
def test_json_depth_scan(raw):
    if raw.startswith(b"{"):
        with pytest.raises(limits.ApiError):
            limits.check_json_depth(raw)
    else:
        limits.check_json_depth(raw)  # brackets inside a string do not nest


def test_empty_api_key_refused(capsys):
    from engine.serving.serve import main

    assert main(["--api-key", ""]) == 2
    assert "--api-key is empty" in capsys.readouterr().err
