"""Stop lists cannot slow other requests down: with fifteen neighbours each carrying the
most stop strings a request may have (of the longest length, never matching), a bystander
finishes within 1.2x of its time beside the same neighbours carrying one stop string of that
length, the median of five alternated pairs.

Both sides carry a stop string of the longest length, so both hold back as much text: a
neighbour's stream shows nothing until its text outgrows the longest stop string, and the
bystander starts once every neighbour has streamed something. Against neighbours with no stop
list it started a few dozen tokens earlier in their lives, and the comparison measured that,
not the matching."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest
from serve_process import API_KEY, MODEL, wait_idle

from engine.config import MAX_STOP_CHARS, MAX_STOP_STRINGS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
NEIGHBOURS = 15
STOPS = [f"{i:04d}" + "\u2603" * (MAX_STOP_CHARS - 4) for i in range(MAX_STOP_STRINGS)]


async def _bystander_time(url: str, stop: list[str] | None) -> float:
    async with httpx.AsyncClient(timeout=300, headers=AUTH,
                                 limits=httpx.Limits(max_connections=NEIGHBOURS + 4)) as http:
        started = asyncio.Event()
        seen = 0

        async def neighbour(i: int) -> None:
            nonlocal seen
            body = {"model": MODEL, "prompt": f"def n{i}():", "max_tokens": 400,
                    "temperature": 0.0, "ignore_eos": True, "stream": True}
            if stop:
                body["stop"] = stop
            async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        seen += 1
                        if seen >= NEIGHBOURS:
                            started.set()

        tasks = [asyncio.ensure_future(neighbour(i)) for i in range(NEIGHBOURS)]
        await asyncio.wait_for(started.wait(), 120)  # the neighbours are decoding
        t0 = time.perf_counter()
        r = await http.post(f"{url}/v1/completions", json={
            "model": MODEL, "prompt": "class Bystander:", "max_tokens": 60,
            "temperature": 0.0, "ignore_eos": True})
        took = time.perf_counter() - t0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return took


@pytest.mark.slow  # ~1 min
def test_a_bystander_is_not_slowed_by_its_neighbours_stop_lists(server):
    plain, stopped = [], []
    for _ in range(5):
        for stop, times in ((STOPS[:1], plain), (STOPS, stopped)):
            wait_idle(server.url)
            times.append(asyncio.run(_bystander_time(server.url, stop)))
    # Each round's pair (one string, then sixteen, alternated): the median of the pairs'
    # ratios, so load that comes and goes hits both sides of a pair alike.
    ratio = statistics.median(b / a for a, b in zip(plain, stopped, strict=True))
    print(f"\nbystander: {min(plain):.2f} s beside neighbours with one stop string, "
          f"{min(stopped):.2f} s "
          f"beside {NEIGHBOURS} x {MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} "
          f"characters (median pair ratio {ratio:.2f}x; medians "
          f"{statistics.median(plain):.2f} s and {statistics.median(stopped):.2f} s)")
    assert ratio < 1.2
