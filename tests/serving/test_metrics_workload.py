"""Each vllm: series after a scripted workload, against what the workload implies.

The workload, on the shared `serve` process: requests that finish (by length, by a stop
string, one streamed with continuous usage), one cancelled mid-stream, and a burst of
streamed requests, four times max_num_seqs, cancelled while most of them still wait. vLLM
counts a prompt's tokens when its prefill is done and leaves client-aborted requests out of
its finished-request series; the test checks exactly that, with the figures the clients
saw (usage) and vLLM's buckets, plus the invariants that hold whatever the timing (one
inter-token sample per token after the first, inference = prefill + decode).
"""

from __future__ import annotations

import asyncio
import json

import httpx
from serve_process import API_KEY, MODEL, SERVED, metric, scrape, wait_idle, wait_scrape

from engine.serving import metric_names as mn

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
LABELS = {"model_name": SERVED, "engine": "0"}
BURST_PROMPT = list(range(40, 72))  # token ids: every burst prompt is 32 tokens long
MAX_NUM_SEQS = 16  # config.yaml's
BURST = 4 * MAX_NUM_SEQS
FINISHED_HISTOGRAMS = (mn.E2E_LATENCY, mn.QUEUE_TIME, mn.INFERENCE_TIME, mn.PREFILL_TIME,
                       mn.DECODE_TIME, mn.REQUEST_PROMPT_TOKENS, mn.REQUEST_GENERATION_TOKENS,
                       mn.MAX_NUM_GENERATION_TOKENS)


def complete(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", headers=HEADERS, timeout=120,
                   json={"model": MODEL, "temperature": 0.0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def stream_events(server, body: dict, stop_after: int | None = None) -> list[dict]:
    """A streamed completion's JSON chunks; with ``stop_after``, the connection is closed
    once that many output tokens were reported (a client that goes away)."""
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/completions", headers=HEADERS, timeout=120,
                      json={"model": MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[6:]))
            use = chunks[-1].get("usage")
            if stop_after is not None and use and use["completion_tokens"] >= stop_after:
                break
    return chunks


async def burst(server) -> tuple[int, list[float]]:
    """BURST streamed requests at once, all cancelled once the engine runs some and the rest
    wait; (how many got text before the cancel, waiting counts scraped meanwhile)."""
    body = {"model": MODEL, "prompt": BURST_PROMPT, "max_tokens": 900, "ignore_eos": True,
            "temperature": 0.0, "stream": True}
    started = asyncio.Event()
    got_text = set()

    async def one(i: int, client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{server.url}/v1/completions", json=body,
                                 headers=HEADERS) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    got_text.add(i)
                    started.set()

    waiting: list[float] = []
    limits = httpx.Limits(max_connections=BURST + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        tasks = [asyncio.create_task(one(i, client)) for i in range(BURST)]
        await asyncio.wait_for(started.wait(), 120)
        for _ in range(40):  # until the gauges show the queue (they trail by <= 1 s)
            r = await client.get(f"{server.url}/metrics")
            waiting.append(metric(_parse(r.text), mn.NUM_REQUESTS_WAITING))
            if waiting[-1] > 0:
                break
            await asyncio.sleep(0.1)
        seen = len(got_text)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return seen, waiting


def _parse(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def buckets(samples: dict, name: str) -> list[float]:
    return sorted(float(dict(lab)["le"]) for (n, lab), _ in samples.items()
                  if n == f"{name}_bucket" and dict(lab)["le"] != "+Inf")


def test_vllm_series_after_a_workload_with_cancellations_and_a_burst(server):
    before = wait_idle(server.url)

    # 1. Requests that finish: by length (greedy, EOS ignored), then by a stop string found
    # in the first one's text, then one streamed with usage on every chunk.
    done = [complete(server, prompt=p, max_tokens=n, ignore_eos=True)
            for p, n in (("import os\n", 7), ("def main():\n", 12), ("class A:\n", 5))]
    text = done[0]["choices"][0]["text"]
    stop = text[len(text) // 2:][:3]
    assert stop.strip(), text
    done.append(complete(server, prompt="import os\n", max_tokens=7, ignore_eos=True,
                         stop=[stop]))
    assert done[-1]["choices"][0]["finish_reason"] == "stop", (text, done[-1])
    chunks = stream_events(server, {"prompt": "for i in", "max_tokens": 9, "ignore_eos": True,
                                    "temperature": 0.0, "stream_options": {
                                        "include_usage": True, "continuous_usage_stats": True}})
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"] is not None for c in chunks)  # usage on every chunk
    assert counts == sorted(counts) and counts[-1] == 9
    assert {c["usage"]["prompt_tokens"] for c in chunks} == {chunks[-1]["usage"]["prompt_tokens"]}
    done.append({"usage": chunks[-1]["usage"],
                 "choices": [{"finish_reason": [c for c in chunks if c["choices"]][-1]
                              ["choices"][0]["finish_reason"]}]})
    prompt_done = sum(d["usage"]["prompt_tokens"] for d in done)
    gen_done = sum(d["usage"]["completion_tokens"] for d in done)
    reasons = [d["choices"][0]["finish_reason"] for d in done]

    # 2. A request cancelled mid-stream, after its first 3 tokens.
    cut = stream_events(server, {"prompt": "while True:", "max_tokens": 900,
                                 "ignore_eos": True, "temperature": 0.0,
                                 "stream_options": {"include_usage": True,
                                                    "continuous_usage_stats": True}},
                        stop_after=3)
    cut_prompt = cut[-1]["usage"]["prompt_tokens"]

    # 3. A burst, cancelled while most of it waits.
    seen, waiting = asyncio.run(burst(server))
    assert max(waiting) > 0, "the burst never queued: it cannot show when prompts count"

    after = wait_idle(server.url)

    def moved(name: str, **labels: str) -> float:
        return metric(after, name, 0, **labels) - metric(before, name, 0, **labels)

    assert moved("gapless:telemetry_dropped_records_total") == 0  # else counts are partial
    # Finished requests: counted, and only they, in every finished-request series.
    for reason in ("length", "stop"):
        assert moved("vllm:request_success_total", finished_reason=reason, **LABELS) \
            == reasons.count(reason)
    assert moved("vllm:request_success_total", finished_reason="abort") == 0  # as in vLLM
    assert moved("gapless:requests_aborted_total") == 1 + BURST
    for name in FINISHED_HISTOGRAMS:
        assert moved(f"{name}_count", **LABELS) == len(done), name
    assert moved(f"{mn.REQUEST_PROMPT_TOKENS}_sum") == prompt_done
    assert moved(f"{mn.REQUEST_GENERATION_TOKENS}_sum") == gen_done
    assert moved(f"{mn.MAX_NUM_GENERATION_TOKENS}_sum") == gen_done
    inference = moved(f"{mn.INFERENCE_TIME}_sum")
    prefill, decode = moved(f"{mn.PREFILL_TIME}_sum"), moved(f"{mn.DECODE_TIME}_sum")
    assert prefill > 0 and decode > 0 and abs(inference - (prefill + decode)) < 1e-6
    assert moved(f"{mn.QUEUE_TIME}_sum") + inference <= moved(f"{mn.E2E_LATENCY}_sum") + 1e-6

    # Prompt tokens count at the first token: the finished requests, the one cut mid-stream,
    # and exactly the burst requests that got a first token (each 32 tokens), never the
    # ones that only waited.
    ttft = moved(f"{mn.TIME_TO_FIRST_TOKEN}_count", **LABELS)
    burst_started = ttft - len(done) - 1
    assert seen <= burst_started < BURST, (seen, burst_started)
    assert moved("vllm:prompt_tokens_total", **LABELS) == \
        prompt_done + cut_prompt + len(BURST_PROMPT) * burst_started
    # Generation tokens: every emitted token, cancelled requests' included; one inter-token
    # sample for each token after a request's first.
    gen = moved("vllm:generation_tokens_total", **LABELS)
    assert gen >= gen_done + 3 + seen
    assert moved(f"{mn.INTER_TOKEN_LATENCY}_count", **LABELS) == gen - ttft
    # Nothing left behind.
    assert metric(after, mn.NUM_REQUESTS_RUNNING, **LABELS) == 0
    assert metric(after, mn.NUM_REQUESTS_WAITING, **LABELS) == 0
    assert metric(after, mn.KV_CACHE_USAGE, **LABELS) == 0
    # vLLM's buckets, so a vLLM dashboard's quantiles read the same.
    assert buckets(after, mn.TIME_TO_FIRST_TOKEN) == list(mn.TTFT_BUCKETS)
    assert buckets(after, mn.INTER_TOKEN_LATENCY) == list(mn.ITL_BUCKETS)
    for name in (mn.E2E_LATENCY, mn.QUEUE_TIME, mn.PREFILL_TIME, mn.DECODE_TIME):
        assert buckets(after, name) == list(mn.REQUEST_LATENCY_BUCKETS)
    assert buckets(after, mn.REQUEST_PROMPT_TOKENS) == [1, 2, 5, 10, 20, 50, 100, 200, 500,
                                                        1000]  # max_model_len 1024


def test_every_vllm_series_has_vllms_labels(server):
    samples = scrape(server.url)
    vllm = {(n, lab) for n, lab in samples if n.startswith("vllm:")}
    assert vllm
    for name, labels in vllm:
        keys = set(dict(labels)) - {"le", "finished_reason"}
        assert keys == {"model_name", "engine"}, (name, labels)


def test_scrapes_are_answered_while_a_burst_waits(server):
    """/metrics is served from pre-rendered bytes: under a burst it still answers, with the
    queue in its gauges (no timing target here)."""
    wait_scrape(server.url, lambda s: metric(s, "gapless:engine_up") == 1, "engine up")
    seen, waiting = asyncio.run(burst(server))
    assert seen >= 1 and max(waiting) > 0
    wait_idle(server.url)
