"""The names, label names and buckets of vLLM's Prometheus series that /metrics exports.

Owns one fact per series: what vLLM calls it and how vLLM buckets it (vLLM's V1 engine,
``vllm/v1/metrics/loggers.py``), so a vLLM dashboard reads our series as it reads vLLM's.
Every ``vllm:*`` series carries the labels ``model_name`` (the first served model name) and
``engine`` ("0": one engine per server). It must never hold a series vLLM does not have under
a ``vllm:`` name: ours are ``gapless:*``. No imports beyond the standard library.
"""

from __future__ import annotations

LABELS: tuple[str, ...] = ("model_name", "engine")
ENGINE_INDEX = "0"

# Counters (prometheus_client appends _total when it renders them).
PROMPT_TOKENS = "vllm:prompt_tokens"                # at each request's first token
GENERATION_TOKENS = "vllm:generation_tokens"        # every emitted token
REQUEST_SUCCESS = "vllm:request_success"            # {finished_reason}
NUM_PREEMPTIONS = "vllm:num_preemptions"

# Gauges.
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"          # a fraction in [0, 1]
GPU_CACHE_USAGE = "vllm:gpu_cache_usage_perc"        # vLLM's older name of the same

# Histograms observed while a request runs (every request, aborted ones included).
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
# Histograms observed once a request finished by stop or length (vLLM records nothing for
# a request its client aborted).
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
INFERENCE_TIME = "vllm:request_inference_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
DECODE_TIME = "vllm:request_decode_time_seconds"
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
MAX_NUM_GENERATION_TOKENS = "vllm:request_max_num_generation_tokens"

# The finish reasons vLLM pre-creates a request_success child for (FinishReason).
FINISHED_REASONS: tuple[str, ...] = ("stop", "length", "abort")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets, sized by
    max_model_len)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10
