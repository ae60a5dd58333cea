"""How long a /metrics scrape takes while hundreds of requests wait, on a real `serve` process.

Starts `python -m engine serve` (CPU by default, the tiny shipped model unless --model says
otherwise), then a load process that opens --requests streamed completions at once (greedy,
EOS ignored, --max-tokens each), and meanwhile scrapes /metrics every --interval seconds from
this process, timing each read end to end (connect, request, whole body). Each scrape's
vllm:num_requests_waiting is kept beside its time, so the table can say how long a read took
*while N requests waited*. The load is cancelled after --duration seconds if it has not
finished (which also exercises the abort path). Idle scrapes before the load give a baseline.

    python -m bench metrics-scrape                                   # ~1-2 min on a 2-core CPU
    python -m bench metrics-scrape --requests 512 --duration 60

The target (issue 23) is p99 < 50 ms with 512 requests waiting.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import report

DESCRIPTION = "/metrics read latency on a serve process while N requests wait (CPU-friendly)"
ROOT = report.ROOT
LISTENING = re.compile(r"gapless: serving .* at (http://[\d.]+:\d+)/v1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="models/gapless-tiny-python",
                        help="model folder or hub id for the served engine")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--requests", type=int, default=512, help="streamed requests at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between scrapes")
    parser.add_argument("--duration", type=float, default=75.0,
                        help="cancel the load after this many seconds")
    parser.add_argument("--idle-scrapes", type=int, default=40)


def start_server(tmp: Path, model: str, device: str) -> tuple[subprocess.Popen, str, Path]:
    import yaml

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["model"] = model
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--port", "0", "--device", device,
             "--no-listen", "--log-level", "warning", "--config", str(tmp / "config.yaml")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    import httpx

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()[-2000:]}")
        m = LISTENING.search(log.read_text(errors="replace"))
        if m:
            try:
                if httpx.get(f"{m.group(1)}/health", timeout=2).status_code == 200:
                    return proc, m.group(1), log
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("serve did not come up in 300 s")


def _load(url: str, n: int, max_tokens: int, duration: float, result: mp.Queue) -> None:
    """The load process: n streamed completions at once; cancelled after ``duration``."""
    import asyncio

    import httpx

    async def main() -> dict:
        done = {"finished": 0, "cancelled": 0, "tokens": 0}
        body = {"prompt": "def fibonacci(n):", "max_tokens": max_tokens, "ignore_eos": True,
                "temperature": 0.0, "stream": True}

        async def one(client: httpx.AsyncClient) -> None:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        done["tokens"] += 1
            done["finished"] += 1

        limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            tasks = [asyncio.create_task(one(client)) for _ in range(n)]
            _, pending = await asyncio.wait(tasks, timeout=duration)
            for t in pending:
                t.cancel()
            done["cancelled"] = len(pending)
            await asyncio.gather(*tasks, return_exceptions=True)
        return done

    result.put(asyncio.run(main()))


def scrape_once(client, url: str) -> tuple[float, float, int]:
    """(seconds for the whole read, requests waiting, requests running) from one scrape."""
    t0 = time.perf_counter()
    text = client.get(f"{url}/metrics").text
    dt = time.perf_counter() - t0

    def gauge(name: str) -> float:
        m = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else float("nan")

    return dt, gauge("vllm:num_requests_waiting"), len(text)


def quantiles(ms: np.ndarray) -> dict:
    if ms.size == 0:
        return {"n": 0}
    return {"n": int(ms.size), "p50_ms": float(np.percentile(ms, 50)),
            "p90_ms": float(np.percentile(ms, 90)), "p99_ms": float(np.percentile(ms, 99)),
            "max_ms": float(ms.max())}


def run(args: argparse.Namespace, out: Path) -> dict:
    import httpx

    with tempfile.TemporaryDirectory() as tmp_name:
        proc, url, log = start_server(Path(tmp_name), args.model, args.device)
        try:
            with httpx.Client(timeout=30) as client:
                idle = [scrape_once(client, url) for _ in range(args.idle_scrapes)]
                ctx = mp.get_context("spawn")
                result: mp.Queue = ctx.Queue()
                loader = ctx.Process(target=_load, args=(url, args.requests, args.max_tokens,
                                                         args.duration, result))
                t_start = time.monotonic()
                loader.start()
                busy = []
                while loader.is_alive() and result.empty():
                    busy.append((time.monotonic() - t_start, *scrape_once(client, url)))
                    time.sleep(args.interval)
                load = result.get(timeout=120)
                loader.join(30)
                wall = time.monotonic() - t_start
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            serve_log = log.read_text(errors="replace")[-4000:]
    idle_ms = np.array([s[0] * 1e3 for s in idle])
    t, busy_ms, waiting, size = (np.array([b[i] for b in busy]) for i in range(4))
    busy_ms = busy_ms * 1e3
    half, full = args.requests // 2, args.requests - 32  # "with ~N waiting" thresholds
    rows_spec = [("idle, before the load", idle_ms),
                 ("during the load (all scrapes)", busy_ms),
                 (f">= {half} waiting", busy_ms[waiting >= half]),
                 (f">= {full} waiting", busy_ms[waiting >= full])]
    stats = {label: quantiles(ms) for label, ms in rows_spec}
    rows = [[label, s.get("n", 0)] + [f"{s[k]:.1f}" if k in s else "-"
                                      for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]
            for label, s in stats.items()]
    table = report.markdown_table(["scrapes", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    facts = (f"{args.requests} streamed requests x {args.max_tokens} tokens on "
             f"{args.model} ({args.device}); load {wall:.1f} s, finished {load['finished']}, "
             f"cancelled {load['cancelled']}; most waiting seen "
             f"{int(np.nanmax(waiting)) if waiting.size else 0}; exposition "
             f"{int(size.max()) if size.size else 0} bytes; load average "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    data = {"stats": stats, "load": load, "wall_s": wall, "requests": args.requests,
            "max_tokens": args.max_tokens, "model": args.model, "device": args.device,
            "loadavg": os.getloadavg(),
            "scrapes": [{"t_s": float(a), "ms": float(b), "waiting": float(c)}
                        for a, b, c in zip(t, busy_ms, waiting, strict=True)]}
    report.emit(out, "metrics_scrape", "/metrics read time under load", [facts, table], data)
    (out / "serve_log_tail.txt").write_text(serve_log)
    return {"stats": stats, "load": load, "wall_s": wall}
