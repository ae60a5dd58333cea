"""/metrics: Prometheus' text format as prometheus_client's parser reads it, vLLM's names
where the meaning is the same, counters moving by exactly what a request used; and the
arithmetic behind them (latencies, busy and idle time) on hand-made telemetry."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from serve_process import MODEL, SERVED, metric, scrape, wait_idle, wait_scrape

from engine.serving.prometheus import EngineMetrics
from telemetry.bus import TelemetryBus
from telemetry.records import RequestEvent, Span, StepRecord

VLLM_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:gpu_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
GAPLESS_TYPES = {
    "gapless:step_busy_seconds": "counter",
    "gapless:device_idle_seconds": "counter",
    "gapless:steps": "counter",
    "gapless:async_batching": "gauge",
    "gapless:num_slots": "gauge",
    "gapless:cuda_graphs": "gauge",
    "gapless:max_num_batched_tokens": "gauge",
    "gapless:kv_blocks_used": "gauge",
    "gapless:engine_up": "gauge",
}


def test_metrics_parse_with_vllm_names_and_types(server):
    r = httpx.get(f"{server.url}/metrics", timeout=30)
    assert r.status_code == 200
    types = {f.name: f.type for f in text_string_to_metric_families(r.text)}
    for name, kind in {**VLLM_TYPES, **GAPLESS_TYPES}.items():
        assert types.get(name) == kind, (name, types.get(name))
    samples = scrape(server.url)
    assert metric(samples, "vllm:num_requests_running", model_name=SERVED, engine="0") >= 0
    assert metric(samples, "gapless:engine_up") == 1
    assert metric(samples, "gapless:async_batching") == 1  # config.yaml's setting
    assert metric(samples, "gapless:num_slots") == 2
    assert metric(samples, "gapless:cuda_graphs") == 0  # CPU
    assert metric(samples, "gapless:max_num_batched_tokens") == 512  # config.yaml's budget


def test_counters_move_by_what_a_request_used(server, oai):
    before = wait_idle(server.url)
    out = oai.completions.create(model=MODEL, prompt="import sys\n", max_tokens=9,
                                 temperature=0.0, extra_body={"ignore_eos": True})

    def moved(name: str, samples: dict | None = None, **labels: str) -> float:
        now = after if samples is None else samples
        return metric(now, name, 0, **labels) - metric(before, name, 0, **labels)

    after = wait_scrape(
        server.url, lambda s: (moved("vllm:e2e_request_latency_seconds_count", s) == 1
                               and moved("vllm:generation_tokens_total", s) == 9),
        "the finished request")
    assert moved("vllm:prompt_tokens_total") == out.usage.prompt_tokens
    assert moved("vllm:generation_tokens_total") == out.usage.completion_tokens == 9
    assert moved("vllm:time_to_first_token_seconds_count") == 1
    assert moved("vllm:inter_token_latency_seconds_count") == 9 - 1
    assert moved("vllm:e2e_request_latency_seconds_count") == 1
    assert moved("vllm:e2e_request_latency_seconds_sum") > 0
    assert moved("vllm:request_success_total", finished_reason="length") == 1
    assert moved("gapless:steps_total") >= 9  # one token a step for a lone request
    assert moved("gapless:step_busy_seconds_total") > 0


# ------------------------------------------------------- the arithmetic, on fake telemetry
class FakeClient:
    """What EngineMetrics reads from an EngineClient, with telemetry written by hand."""

    def __init__(self) -> None:
        self.bus = TelemetryBus()
        self.up = True
        self.stats_ = {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 8,
                       "generated_tokens": 0, "preemptions": 0, "discarded_tokens": 0}

    def telemetry(self) -> TelemetryBus:
        return self.bus

    def alive(self) -> bool:
        return self.up

    def stats(self) -> dict:
        return dict(self.stats_)

    def settings(self) -> dict:
        return {"async_batching": False, "num_slots": 1, "cuda_graphs": False,
                "cuda_graphs_available": False}

    def nvml(self) -> dict | None:
        return self.reading

    reading: dict | None = None


MS = 1_000_000


def read(m: EngineMetrics) -> dict:
    m.poll()
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def step(n: int, start_ms: float, end_ms: float, running: int = 1, mode: str = "sync"
         ) -> StepRecord:
    return StepRecord(step=n, mode=mode, slot=0, num_requests=running, prefill_tokens=0,
                      decode_tokens=running, running=running,
                      spans=[Span("compute", int(start_ms * MS), int(end_ms * MS))])


def test_latencies_follow_the_request_events():
    c = FakeClient()
    m = EngineMetrics(c, "m")
    ev = [RequestEvent("a", "queued", 0, prompt_tokens=7),
          RequestEvent("a", "scheduled", 2 * MS),
          RequestEvent("a", "first_token", 30 * MS, num_tokens=1),
          RequestEvent("a", "tokens", 40 * MS, num_tokens=1),
          RequestEvent("a", "tokens", 60 * MS, num_tokens=2),  # one sample, as vLLM's
          RequestEvent("a", "finished", 61 * MS, reason="stop")]
    for e in ev:
        c.bus.publish_event(e)
    s = read(m)
    assert metric(s, "vllm:prompt_tokens_total") == 7
    assert metric(s, "vllm:request_queue_time_seconds_sum") == 0.002
    assert metric(s, "vllm:time_to_first_token_seconds_sum") == 0.030
    assert metric(s, "vllm:inter_token_latency_seconds_count") == 2
    assert abs(metric(s, "vllm:inter_token_latency_seconds_sum") - 0.030) < 1e-12
    assert metric(s, "vllm:e2e_request_latency_seconds_sum") == 0.061
    assert metric(s, "vllm:request_success_total", finished_reason="stop") == 1
    # A request whose "queued" event came before the reader started gives no latency.
    c.bus.publish_event(RequestEvent("old", "finished", 70 * MS, reason="stop"))
    assert metric(read(m), "vllm:e2e_request_latency_seconds_count") == 1


def test_busy_and_idle_by_cause():
    c = FakeClient()
    m = EngineMetrics(c, "m")
    c.bus.publish_step(step(0, 0, 10))             # work remains after it
    c.bus.publish_step(step(1, 12, 20, running=0))  # 2 ms host gap; then nothing to do
    s = read(m)
    assert abs(metric(s, "gapless:step_busy_seconds_total") - 0.018) < 1e-12
    assert abs(metric(s, "gapless:device_idle_seconds_total", cause="host") - 0.002) < 1e-12
    c.bus.publish_step(step(2, 520, 530, mode="async"))  # 500 ms later a new request came
    s = read(m)
    assert abs(metric(s, "gapless:device_idle_seconds_total", cause="no_requests")
               - 0.5) < 1e-12
    assert abs(metric(s, "gapless:step_busy_seconds_total") - 0.028) < 1e-12
    assert metric(s, "gapless:steps_total", mode="sync") == 2
    assert metric(s, "gapless:steps_total", mode="async") == 1


def test_a_dead_engine_reads_as_down_not_as_an_error():
    c = FakeClient()
    m = EngineMetrics(c, "m")
    c.stats_.update(running=3, kv_blocks_used=4, generated_tokens=11)
    s = read(m)
    assert metric(s, "vllm:num_requests_running") == 3
    assert metric(s, "vllm:kv_cache_usage_perc") == 0.5
    assert metric(s, "vllm:generation_tokens_total") == 11
    assert metric(s, "gapless:engine_up") == 1
    c.up = False
    s = read(m)
    assert metric(s, "gapless:engine_up") == 0
    assert not [k for k in s if k[0] == "vllm:num_requests_running"]


def test_a_restarted_engine_is_read_from_its_new_bus():
    c = FakeClient()
    m = EngineMetrics(c, "m")
    c.bus.publish_event(RequestEvent("a", "queued", 0, prompt_tokens=5))
    c.bus.publish_event(RequestEvent("a", "first_token", 1, num_tokens=1, prompt_tokens=5))
    assert metric(read(m), "vllm:prompt_tokens_total") == 5
    c.bus = TelemetryBus()  # EngineClient.restart() gives a new, empty bus
    c.bus.publish_event(RequestEvent("b", "queued", 0, prompt_tokens=3))
    c.bus.publish_event(RequestEvent("b", "first_token", 1, num_tokens=1, prompt_tokens=3))
    assert metric(read(m), "vllm:prompt_tokens_total") == 8


def test_nvml_readings_become_gauges_when_there_is_a_gpu():
    c = FakeClient()
    m = EngineMetrics(c, "m")
    assert not [k for k in read(m) if k[0].startswith("gapless:gpu_")]  # no GPU: no gauge
    c.reading = {"t_ns": 1, "gpu_util_pct": 97.0, "util_source": "samples",
                 "memory_used_bytes": 2**30, "memory_total_bytes": 2**37,
                 "sm_clock_mhz": 1980, "power_w": None}
    s = read(m)
    assert metric(s, "gapless:gpu_utilization_percent") == 97.0
    assert metric(s, "gapless:gpu_memory_used_bytes") == 2**30
    assert metric(s, "gapless:gpu_sm_clock_mhz") == 1980
    assert not [k for k in s if k[0] == "gapless:gpu_power_watts"]  # not reported
