"""Many clients at once and clients that leave: N concurrent streams each get exactly their
own tokens (greedy text equal to the same prompt run alone), and a client that disconnects
mid-answer has its request aborted and its KV blocks freed."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from serve_process import API_KEY, MODEL, metric, scrape, wait_idle, wait_scrape

CONCURRENT = 200
MAX_TOKENS = 6
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def prompts(n: int) -> list[str]:
    """Distinct prompts of different lengths (2 to ~40 tokens)."""
    names = ["fib", "parse", "load", "main", "run", "walk", "read", "split"]
    return [f"def {names[i % 8]}_{i}({', '.join(f'a{j}' for j in range(i % 13))}):"
            for i in range(n)]


@pytest.mark.slow  # the 200 streams, then the same prompts one by one
def test_concurrent_streams_lose_and_duplicate_no_token(server):
    from openai import AsyncOpenAI, OpenAI

    texts = prompts(CONCURRENT)
    greedy = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0.0,
                  extra_body={"ignore_eos": True})

    async def one(client: AsyncOpenAI, prompt: str) -> tuple[str, int, int, str | None]:
        stream = await client.completions.create(prompt=prompt, stream=True,
                                                 stream_options={"include_usage": True},
                                                 **greedy)
        text, pieces, usage, finish = "", 0, -1, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                pieces += bool(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        return text, pieces, usage, finish

    async def all_at_once() -> list[tuple[str, int, int, str | None]]:
        async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                               timeout=300) as client:
            return await asyncio.gather(*(one(client, p) for p in texts))

    before = wait_idle(server.url)
    t0 = time.monotonic()
    results = asyncio.run(all_at_once())
    took = time.monotonic() - t0
    # Every stream ended with its full count, as "length".
    assert [r[2] for r in results] == [MAX_TOKENS] * CONCURRENT
    assert [r[3] for r in results] == ["length"] * CONCURRENT
    # The same prompts, one at a time on an otherwise idle engine.
    t0 = time.monotonic()
    with OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0) as client:
        alone = [client.completions.create(prompt=p, **greedy).choices[0].text for p in texts]
    took_alone = time.monotonic() - t0
    mismatched = [i for i, (r, a) in enumerate(zip(results, alone, strict=True)) if r[0] != a]
    assert not mismatched, [(texts[i], results[i][0], alone[i]) for i in mismatched[:5]]
    # The engine generated exactly what the clients received, for both rounds.
    wait_scrape(server.url, lambda s: (metric(s, "vllm:generation_tokens_total")
                                       - metric(before, "vllm:generation_tokens_total")
                                       == 2 * CONCURRENT * MAX_TOKENS),
                f"{2 * CONCURRENT * MAX_TOKENS} more generated tokens")
    # They ran batched: all at once took less time than one after another.
    print(f"{CONCURRENT} streams of {MAX_TOKENS} tokens: {took:.1f} s at once, "
          f"{took_alone:.1f} s one by one")
    assert took < took_alone


def _abort_count(url: str) -> float:
    # vLLM leaves client-aborted requests out of vllm:request_success_total; we count them here
    return metric(scrape(url), "gapless:requests_aborted_total", 0)


def _wait_for_aborts(url: str, want: float, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _abort_count(url) < want:
        assert time.monotonic() < deadline, f"no abort seen in {timeout_s:g} s"
        time.sleep(0.1)


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = wait_idle(server.url)
    aborted = _abort_count(server.url)
    body = {"model": MODEL, "prompt": "def main():", "max_tokens": 1000, "temperature": 0.0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body,
                         headers=AUTH) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: {")
                if got == 5:
                    break  # httpx closes the connection here, after 5 chunks of 1000
    _wait_for_aborts(server.url, aborted + 1)
    idle = wait_idle(server.url)
    assert metric(idle, "gapless:kv_blocks_used") == 0
    assert metric(idle, "vllm:kv_cache_usage_perc") == 0
    # It stopped early: far fewer than its 1000 tokens were generated.
    generated = (metric(idle, "vllm:generation_tokens_total")
                 - metric(before, "vllm:generation_tokens_total"))
    assert 5 <= generated < 1000


def test_disconnect_while_waiting_for_a_whole_answer_aborts_it(server):
    before = wait_idle(server.url)
    aborted = _abort_count(server.url)
    body = {"model": MODEL, "prompt": "class A:", "max_tokens": 1000, "temperature": 0.0,
            "ignore_eos": True}
    try:
        httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=1.0)
        raise AssertionError("a 1000-token answer came back within 1 s")
    except httpx.ReadTimeout:
        pass  # httpx closes the connection
    _wait_for_aborts(server.url, aborted + 1)
    idle = wait_idle(server.url)
    assert metric(idle, "gapless:kv_blocks_used") == 0
    assert (metric(idle, "vllm:generation_tokens_total")
            - metric(before, "vllm:generation_tokens_total")) < 1000
