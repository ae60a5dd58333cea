"""Bounds before work: a body over the limit, a declared absurd Content-Length, conflicting
framing, JSON nested too deep and a prompt of too many characters are each refused with a 4xx
in OpenAI's error shape, and the server serves on afterwards."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import httpx
import pytest
from serve_process import API_KEY, MODEL

from engine import envs
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


@pytest.mark.parametrize("raw,deep", [
    (b'{"prompt": ' + b"[" * 300 + b"]" * 300 + b"}", True),
    (b'{"prompt": ' + b"[" * 60 + b"1" + b"]" * 60 + b"}", False),
    (b'{"prompt": "' + b"[" * 300 + b'"}', False),  # brackets inside a string do not nest
])
def test_deep_json_is_refused_by_the_parser_without_recursion(raw, deep):
    from engine.serving.schema import decode_json

    if deep:
        with pytest.raises(limits.ApiError) as e:
            decode_json(raw)
        assert e.value.code == "json_too_deep"
    else:
        decode_json(raw)


def test_empty_api_key_refused(capsys, monkeypatch):
    from engine.serving.serve import main

    assert main(["--api-key", ""]) == 2
    assert "--api-key is empty" in capsys.readouterr().err
    # The same key from the environment is refused the same way, not taken as "no key".
    monkeypatch.setenv(envs.GAPLESS_API_KEY, "")
    assert main([]) == 2
    assert f"${envs.GAPLESS_API_KEY} is empty" in capsys.readouterr().err
    monkeypatch.setenv(envs.GAPLESS_API_KEY, "  ")
    assert main([]) == 2


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


BYPASSES = [
    # (path, body, param, words the message must hold): each was tokenized whole before.
    ("/v1/completions", {"prompt": ["word " * 838_000], "max_tokens": 1}, "prompt",
     ["4190000 characters", "at most 32768 characters"]),
    ("/v1/completions", {"prompt": [[5] * 100_000], "max_tokens": 1}, "prompt",
     ["token ids: 100000", "at most 1023"]),
    ("/v1/completions", {"prompt": [5] * 100_000, "max_tokens": 1}, "prompt",
     ["token ids: 100000", "at most 1023"]),
    # More items than any acceptable request holds: refused before the body is decoded.
    ("/v1/completions", {"prompt": [[5] * 1_000_000], "max_tokens": 1}, None,
     ["1000000 commas", "at most"]),
    ("/v1/chat/completions", {"messages": [{"role": "user"}] * 50_000, "max_tokens": 1},
     "messages", ["messages: 50000", "at most 1024"]),
    # What the template writes around each message counts too, beside its content.
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 31}] * 1024,
                              "max_tokens": 1}, "prompt", ["at most 32768 characters"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": ""}] * 40_000}], "max_tokens": 1}, "messages",
     ["content parts in all messages: 40000", "at most 1024"]),
    ("/v1/completions", {"prompt": "x", "stop": [f"s{i}" for i in range(50_000)]}, "stop",
     ["stop strings: 50000", "at most 16"]),
    ("/v1/completions", {"prompt": "x", "stop": ["s" * 300_000]}, "stop",
     ["300000", "at most 256"]),
]


def test_prompt_bounds_count_what_is_tokenized_and_memory_stays_flat(server):
    before = _rss_mb(server.proc.pid)
    took = []
    for path, body, param, words in BYPASSES:
        t0 = time.monotonic()
        r = httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=120)
        took.append(time.monotonic() - t0)
        assert r.status_code == 400, (path, r.text[:300])
        err = r.json()["error"]
        assert err["param"] == param, err
        for w in words:
            assert w in err["message"], (w, err["message"])
    after = _rss_mb(server.proc.pid)
    print(f"\nserve RSS {before:.0f} -> {after:.0f} MiB over {len(BYPASSES)} refusals, "
          f"each answered in {max(took) * 1000:.0f} ms at most")
    # Each body is decoded once and dropped: no tokenized copy, no gigabytes held.
    assert after - before < 100


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_big_bodies_and_prompts_leave_server_memory_flat(server):
    # The probe: four 10 MB prompts took the server's peak from 0.51 to 7.39 GB. Now each is
    # refused before it is held whole or tokenized; the peak may grow by a few bodies' worth.
    import concurrent.futures
    import time

    before = _peak_rss_mb(server.proc.pid)
    big = b'{"prompt": "' + b"a " * (5 * 1024 * 1024) + b'"}'  # 10 MB, declared length
    near = b'{"prompt": "' + b"a " * (limits.MAX_BODY_BYTES // 2 - 64) + b'"}'  # fits the body

    def chunked(n: int):  # no Content-Length: refused once the read passes the limit
        for _ in range(n):
            yield b"a" * (1024 * 1024)

    def post(body) -> tuple[int, float]:
        t0 = time.monotonic()
        r = httpx.post(f"{server.url}/v1/completions", content=body, timeout=120,
                       headers={**AUTH, "Content-Type": "application/json"})
        return r.status_code, time.monotonic() - t0

    bodies = [big] * 4 + [near] * 4 + [chunked(10) for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(post, bodies))
    after = _peak_rss_mb(server.proc.pid)
    print(f"\nserver peak RSS {before:.0f} -> {after:.0f} MiB over {len(bodies)} refusals; "
          f"answered in {', '.join(f'{s} {t * 1000:.0f} ms' for s, t in answers)}")
    assert [s for s, _ in answers] == [413] * 4 + [400] * 4 + [413] * 4
    # Bounded by the bodies it may hold (the limit each, parsed once): not gigabytes.
    assert after - before < 16 * limits.MAX_BODY_BYTES / 2**20


def test_tokenization_gate_refuses_beyond_its_queue():
    import asyncio
    import threading

    release = threading.Event()

    async def main() -> list:
        gate = limits.WorkGate("tokenizations", limit=1, max_waiting_cost=100)
        running = asyncio.ensure_future(gate.run(release.wait, 30, cost=1000))
        await asyncio.sleep(0.2)
        queued = [asyncio.ensure_future(gate.run(lambda: "queued ran", cost=40))
                  for _ in range(2)]  # short prompts queue
        await asyncio.sleep(0.1)
        with pytest.raises(limits.ApiError) as exc:  # 80 + 40 characters would pass 100
            await gate.run(lambda: "never", cost=40)
        assert exc.value.status == 503 and exc.value.code == "server_busy"
        release.set()
        return [await running, *[await q for q in queued]]

    assert asyncio.run(main()) == [True, "queued ran", "queued ran"]
