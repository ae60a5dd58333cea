"""Stop lists cannot slow other requests down: with fifteen neighbours each carrying the
most stop strings a request may have (of the longest length, never matching), the engine
spends within 1.2x of the CPU time on the bystander's steps that it spends beside the same
neighbours carrying one stop string of that length, the median of five alternated pairs.

The engine process's CPU time over the bystander's request, not its wall time: matching runs
on the step loop's thread, so what it costs shows in the CPU time of the steps, while the
wall time of a request on a shared machine also holds whatever else ran (CI runs this beside
other tests: a pair's wall times differed by 1.3x there with equal CPU times).

Both sides carry a stop string of the longest length, so both hold back as much text: a
neighbour's stream shows nothing until its text outgrows the longest stop string, and the
bystander starts once every neighbour has streamed something. Against neighbours with no stop
list it started a few dozen tokens earlier in their lives, and the comparison measured that,
not the matching."""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import httpx
import pytest
from serve_process import API_KEY, MODEL, wait_idle

from engine.config import MAX_STOP_CHARS, MAX_STOP_STRINGS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
NEIGHBOURS = 15
STOPS = [f"{i:04d}" + "\u2603" * (MAX_STOP_CHARS - 4) for i in range(MAX_STOP_STRINGS)]


def _cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _bystander_time(url: str, stop: list[str] | None,
                          engine_pid: int) -> tuple[float, float]:
    """(wall seconds, engine CPU seconds) of the bystander's request."""
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
        t0, c0 = time.perf_counter(), _cpu_s(engine_pid)
        r = await http.post(f"{url}/v1/completions", json={
            "model": MODEL, "prompt": "class Bystander:", "max_tokens": 60,
            "temperature": 0.0, "ignore_eos": True})
        took, cpu = time.perf_counter() - t0, _cpu_s(engine_pid) - c0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return took, cpu


@pytest.mark.slow  # ~1 min
def test_a_bystander_is_not_slowed_by_its_neighbours_stop_lists(server):
    plain, stopped = [], []
    pid = server.engine_pid()
    for _ in range(5):
        for stop, times in ((STOPS[:1], plain), (STOPS, stopped)):
            wait_idle(server.url)
            times.append(asyncio.run(_bystander_time(server.url, stop, pid)))
    # Each round's pair (one string, then sixteen, alternated): the median of the pairs'
    # ratios, so load that comes and goes hits both sides of a pair alike.
    cpu = statistics.median(b[1] / a[1] for a, b in zip(plain, stopped, strict=True))
    wall = statistics.median(b[0] / a[0] for a, b in zip(plain, stopped, strict=True))
    print(f"\nbystander beside neighbours with one stop string / with {NEIGHBOURS} x "
          f"{MAX_STOP_STRINGS} stop strings of {MAX_STOP_CHARS} characters: engine CPU "
          f"{statistics.median(c for _, c in plain):.2f} / "
          f"{statistics.median(c for _, c in stopped):.2f} s (median pair ratio {cpu:.2f}x), "
          f"wall {statistics.median(w for w, _ in plain):.2f} / "
          f"{statistics.median(w for w, _ in stopped):.2f} s ({wall:.2f}x)")
    assert cpu < 1.2
