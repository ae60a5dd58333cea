"""Writes docs/grafana/gapless.json: vLLM's request panels and ours (step busy, idle, GPM).

    .venv/bin/python scripts/grafana_dashboard.py           # rewrite the dashboard
    .venv/bin/python scripts/grafana_dashboard.py --check   # exit 1 if it is out of date

The request panels ask what vLLM's own Grafana dashboard asks (same series, same PromQL), so a
panel reads the same on either server; ours follow. Each query names only series that
/metrics exports: ``exported_series()`` renders the exposition of an EngineMetrics fed a
stand-in client with every reading present (NVML and GPM as on an H200), and the dashboard's
optional panels (the step waterfall, prefix cache) are added only when their series are
there. tests/serving/test_grafana_dashboard.py checks both. No Grafana server is needed: none
installs from a package registry here (see docs/grafana/README.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "grafana" / "gapless.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
M = 'model_name="$model_name"'
RATE = "[$__rate_interval]"


def exported_series() -> set[str]:
    """Every sample name the renderer writes (counters with _total, histograms with _bucket,
    _sum, _count), with all optional readings present."""
    from prometheus_client.parser import text_string_to_metric_families

    from engine.serving.prometheus import EngineMetrics
    from telemetry.bus import TelemetryBus
    from telemetry.records import RequestEvent, Span, StepRecord

    class Client:
        bus = TelemetryBus()

        def telemetry(self) -> TelemetryBus:
            return self.bus

        def alive(self) -> bool:
            return True

        def stats(self) -> dict:
            return {"running": 1, "waiting": 0, "kv_blocks_used": 1, "kv_blocks_total": 8,
                    "generated_tokens": 2, "preemptions": 0, "discarded_tokens": 0}

        def settings(self) -> dict:
            return {"async_batching": True, "num_slots": 2, "cuda_graphs": True,
                    "cuda_graphs_available": True}

        def nvml(self) -> dict:
            return {"gpu_util_pct": 99.0, "memory_used_bytes": 1, "memory_total_bytes": 2,
                    "sm_clock_mhz": 1980, "power_w": 500.0, "dram_bw_util_pct": 70.0,
                    "sm_util_pct": 90.0, "graphics_util_pct": 95.0, "sm_occupancy_pct": 30.0}

    c = Client()
    m = EngineMetrics(c, "m")
    ms = 1_000_000
    for kind, t in (("queued", 0), ("scheduled", 1), ("first_token", 2), ("tokens", 3)):
        tokens = 1 if kind in ("first_token", "tokens") else 0
        c.bus.publish_event(RequestEvent("r", kind, t * ms, num_tokens=tokens, prompt_tokens=4))
    c.bus.publish_event(RequestEvent("r", "finished", 4 * ms, reason="length"))
    lanes = ("cpu.schedule", "cpu.prepare", "cpu.launch", "h2d", "compute", "d2h", "cpu.post")
    for n in range(2):
        c.bus.publish_step(StepRecord(
            step=n, mode="async", slot=n % 2, num_requests=1, prefill_tokens=4 * (n == 0),
            decode_tokens=n, running=1, graph_bucket=1,
            spans=[Span(lane, (10 * n + i) * ms, (10 * n + i + 1) * ms)
                   for i, lane in enumerate(lanes)]))
    m.poll()
    return {s.name for f in text_string_to_metric_families(m.render().decode())
            for s in f.samples}


def names_in(expr: str) -> set[str]:
    """The series a PromQL expression names (ours and vLLM's)."""
    return set(re.findall(r"\b(?:vllm:|gapless[:_])[A-Za-z0-9_:]+", expr))


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend,
            "range": True, "refId": ref}


def panel(title: str, description: str, exprs: list[tuple[str, str]], unit: str = "none",
          kind: str = "timeseries") -> dict[str, Any]:
    p: dict[str, Any] = {
        "datasource": DS, "title": title, "description": description, "type": kind,
        "fieldConfig": {"defaults": {"unit": unit, "color": {"mode": "palette-classic"}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom",
                               "showLegend": True}, "tooltip": {"mode": "multi"}},
        "targets": [target(e, leg, chr(ord("A") + i)) for i, (e, leg) in enumerate(exprs)],
    }
    if kind == "heatmap":
        p["targets"][0]["format"] = "heatmap"
        p["options"] = {"calculate": False, "yAxis": {"unit": unit},
                        "cellGap": 1, "color": {"mode": "scheme", "scheme": "Spectral"}}
    return p


def quantiles(series: str) -> list[tuple[str, str]]:
    out = [(f"histogram_quantile({q}, sum by(le) (rate({series}_bucket{{{M}}}{RATE})))",
            f"P{int(q * 100)}") for q in (0.99, 0.95, 0.9, 0.5)]
    out.append((f"rate({series}_sum{{{M}}}{RATE})\n/\nrate({series}_count{{{M}}}{RATE})",
                "Mean"))
    return out


def request_panels() -> list[dict[str, Any]]:
    """vLLM's dashboard, panel for panel (examples/observability/prometheus_grafana)."""
    return [
        panel("E2E Request Latency", "End to end request latency of requests that finished "
              "(stop or length; client-aborted requests are left out, as vLLM does).",
              quantiles("vllm:e2e_request_latency_seconds"), "s"),
        panel("Token Throughput", "Prompt tokens counted when a request's prefill is done; "
              "generated tokens as they are emitted.",
              [(f"rate(vllm:prompt_tokens_total{{{M}}}{RATE})", "Prompt Tokens/Sec"),
               (f"rate(vllm:generation_tokens_total{{{M}}}{RATE})", "Generation Tokens/Sec")]),
        panel("Inter Token Latency", "Time between a request's consecutive tokens.",
              quantiles("vllm:inter_token_latency_seconds"), "s"),
        panel("Scheduler State", "Requests running in the batch and waiting in the queue.",
              [(f"vllm:num_requests_running{{{M}}}", "Num Running"),
               (f"vllm:num_requests_waiting{{{M}}}", "Num Waiting")]),
        panel("Time To First Token Latency", "Queued to first token.",
              quantiles("vllm:time_to_first_token_seconds"), "s"),
        panel("Cache Utilization", "Fraction of KV-cache blocks in use.",
              [(f"vllm:kv_cache_usage_perc{{{M}}}", "KV Cache Usage")], "percentunit"),
        panel("Request Prompt Length", "Prompt tokens of finished requests.",
              [(f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{{{M}}}{RATE}))",
                "{{le}}")], "none", "heatmap"),
        panel("Request Generation Length", "Generated tokens of finished requests.",
              [(f"sum by(le) (increase(vllm:request_generation_tokens_bucket{{{M}}}{RATE}))",
                "{{le}}")], "none", "heatmap"),
        panel("Finish Reason", "Finished requests by reason (aborted: the next panel).",
              [(f"sum by(finished_reason) (increase(vllm:request_success_total{{{M}}}{RATE}))",
                "{{finished_reason}}")]),
        panel("Queue Time", "Time requests spent waiting, per second of wall time.",
              [(f"rate(vllm:request_queue_time_seconds_sum{{{M}}}{RATE})", "Queue Time")], "s"),
        panel("Requests Prefill and Decode Time", "First scheduled to first token, and first "
              "token to last, per second of wall time.",
              [(f"rate(vllm:request_prefill_time_seconds_sum{{{M}}}{RATE})", "Prefill"),
               (f"rate(vllm:request_decode_time_seconds_sum{{{M}}}{RATE})", "Decode")], "s"),
        panel("Max Generation Token in Sequence Group", "Generated tokens of finished "
              "requests (n = 1: a request's own), per second of wall time.",
              [(f"rate(vllm:request_max_num_generation_tokens_sum{{{M}}}{RATE})",
                "Max Generated Tokens")]),
    ]


def gapless_panels(exported: set[str]) -> list[dict[str, Any]]:
    panels = [
        panel("Step busy", "Share of wall time the compute lane was busy (each step's first "
              "kernel to its last, overlaps counted once).",
              [(f"rate(gapless:step_busy_seconds_total{RATE})", "step busy")], "percentunit"),
        panel("Device idle by cause", "Compute-lane gaps between steps, per second: host = "
              "the device waited on the CPU while requests were in flight; no_requests = "
              "nothing to run.",
              [(f"sum by(cause) (rate(gapless:device_idle_seconds_total{RATE}))", "{{cause}}")],
              "percentunit"),
        panel("Steps by mode", "Engine steps per second, by async/sync and CUDA graph.",
              [(f"sum by(mode, cuda_graph) (rate(gapless:steps_total{RATE}))",
                "{{mode}} graph={{cuda_graph}}")], "ops"),
        panel("Aborted and failed requests", "Requests aborted (a client that left) and "
              "ended by an error, per second: vLLM's series leave them out.",
              [(f"rate(gapless:requests_aborted_total{RATE})", "aborted"),
               (f"rate(gapless:requests_failed_total{RATE})", "failed")], "reqps"),
        panel("GPU: memory bandwidth and SMs (GPM)", "NVML GPM, Hopper and newer: DRAM "
              "bandwidth used (how near the byte floor decode runs), SM activity and "
              "occupancy; NVML's utilisation for comparison.",
              [("gapless:gpu_dram_bandwidth_percent", "DRAM bandwidth %"),
               ("gapless:gpu_sm_active_percent", "SM active %"),
               ("gapless:gpu_sm_occupancy_percent", "SM occupancy %"),
               ("gapless:gpu_utilization_percent", "NVML utilisation %")], "percent"),
        panel("GPU power and clock", "Board power (W) and SM clock (MHz), NVML.",
              [("gapless:gpu_power_watts", "power W"), ("gapless:gpu_sm_clock_mhz",
                                                       "SM clock MHz")]),
        panel("Padded and discarded tokens", "Tokens added to reach a CUDA graph's bucket, "
              "and tokens computed one step late for a finished request, per second.",
              [(f"rate(gapless:padded_tokens_total{RATE})", "padded"),
               (f"rate(gapless:discarded_tokens_total{RATE})", "discarded")]),
        panel("Stalls by cause", "Steps much slower than recent steps of their kind, per "
              "second, by the cause the engine named (docs/stalls.md), and the longest "
              "stall's interval in seconds.",
              [(f"sum by(cause) (rate(gapless:stalls_total{RATE}))", "{{cause}}"),
               ("gapless:stall_max_seconds", "longest stall (s)")]),
    ]
    if "gapless_step_seconds_total" in exported:  # the step waterfall
        panels.append(panel(
            "Step waterfall", "Where each second of step time goes, by component.",
            [(f"sum by(component) (rate(gapless_step_seconds_total{RATE}))", "{{component}}")],
            "percentunit"))
    if "vllm:prefix_cache_queries_total" in exported and "vllm:prefix_cache_hits_total" \
            in exported:
        panels.append(panel(
            "Prefix Cache Hit Rate", "Cached prompt tokens over queried prompt tokens.",
            [(f"rate(vllm:prefix_cache_hits_total{{{M}}}{RATE})\n/\n"
              f"rate(vllm:prefix_cache_queries_total{{{M}}}{RATE})", "hit rate")],
            "percentunit"))
    return panels


def build(exported: set[str]) -> dict[str, Any]:
    panels = request_panels() + gapless_panels(exported)
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    return {
        "title": "gapless", "uid": "gapless", "description": "gapless: vLLM's request "
        "panels (same series, same meaning) and the engine's own step, idle and GPU series",
        "editable": True, "schemaVersion": 39, "version": 1, "time": {"from": "now-15m",
                                                                      "to": "now"},
        "refresh": "5s", "tags": ["gapless", "vllm"],
        "templating": {"list": [
            {"name": "DS_PROMETHEUS", "label": "datasource", "type": "datasource",
             "query": "prometheus"},
            {"name": "model_name", "label": "model_name", "type": "query", "datasource": DS,
             "query": "label_values(vllm:num_requests_running, model_name)", "refresh": 1}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(exported_series()), indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)} is {'up to date' if same else 'out of date'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
