"""GET /v1/requests/{id}/ledger: one request's ledger, joined to the steps it rode; 404 in
OpenAI's error shape for an id the server's telemetry does not hold.

The first tests run the real app (create_app) in process over a client whose telemetry
mirror holds recorded steps, so they need no engine; the last asks the shared served engine
for the ledger of a completion it just answered."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from engine.serving.app import create_app
from telemetry.bus import TelemetryBus
from telemetry.records import RequestEvent, Span, StepRecord

KEY = "k-ledger"


class RecordedClient:
    """What create_app and the ledger route read of an EngineClient, over recorded steps."""

    def __init__(self, telemetry: bool = True) -> None:
        self.bus = TelemetryBus()
        self._settings = {"model": "tiny", "max_model_len": 64, "telemetry": telemetry,
                          "kv_bytes_per_token": 8}
        steps = [
            StepRecord(0, "sync", 0, 1, 5, 0, spans=[Span("compute", 100, 400)],
                       chunks=[("cmpl-a", 5, 5)]),
            StepRecord(1, "sync", 0, 2, 3, 1, spans=[Span("compute", 500, 900)],
                       chunks=[("cmpl-a", 1, 6), ("cmpl-b", 3, 3)]),
        ]
        events = [RequestEvent("cmpl-a", "queued", 0, prompt_tokens=5),
                  RequestEvent("cmpl-a", "scheduled", 90, prompt_tokens=5),
                  RequestEvent("cmpl-a", "first_token", 410, 1, prompt_tokens=5),
                  RequestEvent("cmpl-a", "tokens", 910, 1, prompt_tokens=5),
                  RequestEvent("cmpl-a", "finished", 920, prompt_tokens=5, reason="length",
                               cached_tokens=4, preemptions=0)]
        for s in steps:
            self.bus.publish_step(s)
        for e in events:
            self.bus.publish_event(e)

    def settings(self) -> dict:
        return dict(self._settings)

    def telemetry(self) -> TelemetryBus:
        return self.bus


def http(client: RecordedClient) -> TestClient:
    return TestClient(create_app(client, tokenizer=None, api_key=KEY),
                      headers={"Authorization": f"Bearer {KEY}"})


def test_a_requests_ledger_joined_to_its_steps():
    r = http(RecordedClient()).get("/v1/requests/cmpl-a/ledger")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "request.ledger" and body["request_id"] == "cmpl-a"
    assert body["prefill_steps"] == [0] and body["decode_steps"] == [1]
    assert body["finish_reason"] == "length" and body["finished"] is True
    assert body["cached_tokens"] == 4 and body["preemptions"] == 0
    assert body["queue_s"] == pytest.approx(90e-9) and body["e2e_s"] == pytest.approx(920e-9)
    # All of step 0, a quarter of step 1 (1 of its 4 tokens).
    assert body["device_s"] == pytest.approx((300 + 400 / 4) * 1e-9)
    assert body["kv_bytes_read"] == (5 + 6) * 8


def test_an_unknown_id_is_a_404_in_openais_shape():
    r = http(RecordedClient()).get("/v1/requests/cmpl-nobody/ledger")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "request_not_found" and err["param"] == "request_id"
    assert "cmpl-nobody" in err["message"] and err["type"] == "invalid_request_error"


def test_telemetry_off_says_so_and_the_key_is_checked():
    r = http(RecordedClient(telemetry=False)).get("/v1/requests/cmpl-a/ledger")
    assert r.status_code == 404 and r.json()["error"]["code"] == "telemetry_off"
    bare = TestClient(create_app(RecordedClient(), tokenizer=None, api_key=KEY))
    assert bare.get("/v1/requests/cmpl-a/ledger").status_code == 401


def test_a_repeated_prompt_is_cached_seen_in_usage_ledger_and_metrics(server, oai):
    """The served engine end to end: the second of two identical prompts reports its cached
    prompt tokens in usage (over the process wire), in its ledger, and in vLLM's counters."""
    from serve_process import API_KEY, MODEL, metric, scrape, wait_scrape

    prompt = "# the ledger's own prompt, long enough for whole KV blocks\n" * 6
    greedy = dict(max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    hits_before = metric(scrape(server.url), "vllm:prefix_cache_hits_total")
    first = oai.completions.create(model=MODEL, prompt=prompt, **greedy)
    again = oai.completions.create(model=MODEL, prompt=prompt, **greedy)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens  # its last prompt token is computed
    assert again.choices[0].text == first.choices[0].text
    bodies = {}
    for done in (first, again):
        r = httpx.get(f"{server.url}/v1/requests/{done.id}/ledger",
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
        assert r.status_code == 200, r.text
        bodies[done.id] = r.json()
    a, b = bodies[first.id], bodies[again.id]
    assert (a["finish_reason"], b["finish_reason"]) == ("length", "length")
    assert a["output_tokens"] == b["output_tokens"] == 5 and len(b["decode_steps"]) == 4
    assert a["prompt_tokens"] == b["prompt_tokens"] == again.usage.prompt_tokens
    assert b["cached_tokens"] == cached
    assert b["device_s"] > 0 and b["kv_bytes_read"] > 0
    wait_scrape(server.url, lambda m: metric(m, "vllm:prefix_cache_hits_total")
                >= hits_before + cached, "the cached tokens in vllm:prefix_cache_hits_total")
