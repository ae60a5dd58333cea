"""docs/grafana/gapless.json: every query names a series /metrics exports, the file is what
scripts/grafana_dashboard.py writes, and the vLLM request panels ask vLLM's questions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from serve_process import SERVED, scrape

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "gapless.json"


def generator():
    spec = importlib.util.spec_from_file_location("grafana_dashboard",
                                                  ROOT / "scripts" / "grafana_dashboard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def queries(board: dict) -> list[str]:
    out = [t["expr"] for p in board["panels"] for t in p["targets"]]
    out += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return out


def test_every_query_names_a_series_the_renderer_exports():
    gen = generator()
    board = json.loads(DASHBOARD.read_text())
    exported = gen.exported_series()
    named = set().union(*(gen.names_in(q) for q in queries(board)))
    assert named, "no series found in the dashboard's queries"
    assert named <= exported, sorted(named - exported)
    # vLLM's request panels are all there, with the series they chart.
    for series in ("vllm:request_prompt_tokens_bucket", "vllm:request_generation_tokens_bucket",
                   "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
                   "vllm:request_max_num_generation_tokens_sum", "vllm:prompt_tokens_total",
                   "gapless:step_busy_seconds_total", "gapless:device_idle_seconds_total",
                   "gapless:gpu_dram_bandwidth_percent"):
        assert series in named, series


def test_the_file_is_what_the_generator_writes():
    assert DASHBOARD.read_text() == generator().render(), \
        "run .venv/bin/python scripts/grafana_dashboard.py"


def test_a_running_server_exports_every_series_but_the_gpu_ones(server):
    """On the CPU test server: each series the dashboard names is in a real scrape, except
    NVML/GPM readings, which need a GPU; the model_name variable finds the served name."""
    gen = generator()
    named = set().union(*(gen.names_in(q) for q in queries(json.loads(DASHBOARD.read_text()))))
    seen = {name for name, _ in scrape(server.url)}
    missing = {n for n in named - seen if not n.startswith("gapless:gpu_")}
    assert not missing, sorted(missing)
    assert any(n == "vllm:num_requests_running" and dict(lab)["model_name"] == SERVED
               for n, lab in scrape(server.url))
