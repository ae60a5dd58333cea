"""How fast `engine serve` refuses one oversized request at a time, and what it costs its memory.

Starts `python -m engine serve` (CPU, the tiny shipped model unless --model says otherwise)
and sends each kind of oversized request alone, --repeats times in turn, each on a fresh
connection, timing from connect to the last byte of the answer (a 4 MiB upload over
localhost included). The kinds (issue 21's "bounds before work"):

- body: a completion whose body is 10 bytes over the 4 MiB --max-body-bytes -> 413;
- declared: a head declaring Content-Length 10 GB, then a few body bytes -> 413 before the body;
- chunked: 5 MiB sent chunked (no length declared: read up to the limit) -> 413;
- chars: a 1 MiB prompt (under the body limit) of more characters than max_model_len allows
  -> 400 before tokenizing;
- nested: 100,000 nested brackets -> 400 before the JSON parser runs.

Also the serve process's resident and peak memory (VmRSS, VmHWM) before and after, a normal
completion after the refusals (the server serves on), and the load average at start and end:
on a shared machine the figures are only as quiet as the machine was.

    python -m bench refusal                       # ~30 s on a 2-core CPU
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

from bench.harness import report
from bench.suites.metrics_scrape import start_server

DESCRIPTION = "serve's refusal time for one oversized request at a time, and its memory"
MAX_BODY_BYTES = 4 * 1024 * 1024  # engine.serving.limits.MAX_BODY_BYTES, serve's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="models/gapless-tiny-python",
                        help="model folder or hub id for the served engine")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--repeats", type=int, default=20, help="requests of each kind")


def _head(length: int | None) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    return (f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json"
            f"\r\n{framing}\r\nConnection: close\r\n\r\n").encode()


def _chunked(body: bytes, size: int = 65536) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def requests_by_kind(model: str) -> dict[str, bytes]:
    """The raw bytes of one request of each kind."""
    def completion(prompt: str) -> bytes:
        return json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()

    body = completion("x" * (MAX_BODY_BYTES + 10))
    chars = completion("a " * (2**19))  # 1 MiB of prompt, ~60 KiB under the body limit
    nested = b"[" * 100_000 + b"]" * 100_000
    return {"body": _head(len(body)) + body,
            "declared": _head(10_000_000_000) + b'{"prompt":',
            "chunked": _head(None) + _chunked(completion("x" * (5 * 2**20))),
            "chars": _head(len(chars)) + chars,
            "nested": _head(len(nested)) + nested}


def send_once(host: str, port: int, raw: bytes) -> tuple[float, int]:
    """(seconds from connect to the answer's last byte, HTTP status). The request is sent from
    a thread: the server may answer, and close, before it has read the whole upload."""
    t0 = time.perf_counter()
    with socket.create_connection((host, port), timeout=60) as s:
        def upload() -> None:
            try:
                s.sendall(raw)
            except OSError:  # refused before the end of the body: that is the point
                pass

        sender = threading.Thread(target=upload, daemon=True)
        sender.start()
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        dt = time.perf_counter() - t0
    sender.join(10)
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return dt, status


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def run(args: argparse.Namespace, out: Path) -> dict:
    import httpx

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_name:
        proc, url, log = start_server(Path(tmp_name), args.model, args.device)
        try:
            u = urlparse(url)
            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
            kinds = requests_by_kind(model)
            mem_before = memory_kib(proc.pid)
            times: dict[str, list[float]] = {k: [] for k in kinds}
            statuses: dict[str, set[int]] = {k: set() for k in kinds}
            for _ in range(args.repeats):
                for kind, raw in kinds.items():  # in turn: one request at a time
                    dt, status = send_once(u.hostname, u.port, raw)
                    times[kind].append(dt)
                    statuses[kind].add(status)
            mem_after = memory_kib(proc.pid)
            ok = httpx.post(f"{url}/v1/completions", timeout=60, json={
                "model": model, "prompt": "def f():", "max_tokens": 2}).status_code
        finally:
            proc.terminate()
            proc.wait(30)
    load_end = os.getloadavg()
    rows, stats = [], {}
    for kind, ts in times.items():
        ms = np.array(ts) * 1e3
        stats[kind] = {"n": int(ms.size), "status": sorted(statuses[kind]),
                       "p50_ms": float(np.median(ms)), "max_ms": float(ms.max()),
                       "min_ms": float(ms.min())}
        s = stats[kind]
        rows.append([kind, "/".join(map(str, s["status"])), s["n"], f"{s['min_ms']:.1f}",
                     f"{s['p50_ms']:.1f}", f"{s['max_ms']:.1f}"])
    table = report.markdown_table(["request", "status", "n", "min ms", "p50 ms", "max ms"],
                                  rows)
    facts = (f"serve on {args.model} ({args.device}), one request at a time; serve's memory "
             f"RSS {mem_before['VmRSS'] / 1024:.0f} -> {mem_after['VmRSS'] / 1024:.0f} MiB, "
             f"peak {mem_before['VmHWM'] / 1024:.0f} -> {mem_after['VmHWM'] / 1024:.0f} MiB; "
             f"a normal completion afterwards: {ok}; load average at start "
             f"{' '.join(f'{x:.2f}' for x in load_start)}, at end "
             f"{' '.join(f'{x:.2f}' for x in load_end)}")
    data = {"stats": stats, "memory_kib": {"before": mem_before, "after": mem_after},
            "completion_after": ok, "loadavg_start": load_start, "loadavg_end": load_end,
            "model": args.model, "device": args.device, "repeats": args.repeats}
    report.emit(out, "refusal", "Refusal time of one oversized request on serve",
                [facts, table], data)
    return data
