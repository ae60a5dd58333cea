"""GuideLLM (the vLLM project's benchmark client) against `python -m engine serve`.

Starts `python -m engine serve` (CPU by default, config.yaml's model: SmolLM2-135M-Instruct),
runs one GuideLLM sweep against it (synchronous, throughput, then constant rates between the
two), and tabulates GuideLLM's own figures per rate beside what the server's /metrics counted
over the same run, so the two views of one workload can be compared:

    python -m bench guidellm --guidellm /path/to/venv/bin/guidellm      # ~3-5 min on 2 CPUs

It installs nothing: GuideLLM (PyPI `guidellm`, tried at 0.8.1) is found with --guidellm, else
on PATH, else beside this interpreter. It pulls torch and transformers, so a venv of its own that
sees this one's packages keeps .venv untouched:

    python3 -m venv ../gl && echo "$PWD/.venv/lib/python3.11/site-packages" \
        > ../gl/lib/python3.11/site-packages/main.pth && ../gl/bin/pip install guidellm==0.8.1

The tokenizer GuideLLM is given: the model's local folder (it holds the tokenizer files). With
hub access the served name, `HuggingFaceTB/SmolLM2-135M-Instruct` (the hub id, /v1/models lists
it), loads the same tokenizer; offline the hub id fails, so the folder is passed explicitly.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import report

DESCRIPTION = ("what GuideLLM's sweep measures against `engine serve`, beside what /metrics "
               "counted")
ROOT = report.ROOT
GUIDELLM_VERSION = "0.8.1"

# Server-side series compared with GuideLLM's client-side figures (deltas over the run).
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "gapless:requests_aborted_total", "gapless:requests_failed_total")
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--guidellm", help="the guidellm executable (default: on PATH, else "
                        "beside this interpreter)")
    parser.add_argument("--model", default=None,
                        help="model folder or hub id for the served engine (default: "
                        "config.yaml's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer GuideLLM loads (default: the model's folder)")
    parser.add_argument("--sweep-size", type=int, default=4,
                        help="benchmarks in the sweep (synchronous, throughput, N-2 rates)")
    parser.add_argument("--max-seconds", type=float, default=30.0,
                        help="length of each benchmark of the sweep")
    parser.add_argument("--max-concurrency", type=int, default=16,
                        help="most requests GuideLLM keeps open (throughput step)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--request-format", default="/v1/completions",
                        choices=["/v1/completions", "/v1/chat/completions"])


def find_guidellm(given: str | None) -> str:
    """The guidellm executable; SystemExit with what to do when there is none."""
    candidates = [given] if given else [shutil.which("guidellm"),
                                        str(Path(sys.executable).with_name("guidellm"))]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise SystemExit(f"guidellm not found ({given or 'PATH, ' + sys.executable + ' folder'}); "
                     f"install it (pip install guidellm=={GUIDELLM_VERSION}, see this suite's "
                     "docstring for a venv that leaves .venv alone) and pass --guidellm PATH")


def scrape(url: str) -> dict[str, float]:
    """Every sample of /metrics as {"name{labels}": value}."""
    import httpx

    values: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                values[key] = float(value)
            except ValueError:
                pass
    return values


def series(values: dict[str, float], name: str) -> float:
    """Sum of a series over its label sets (0.0 when absent)."""
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What /metrics counted between two scrapes: counter deltas, histogram counts and means."""
    view: dict[str, Any] = {}
    for name in COUNTERS:
        view[name] = series(after, name) - series(before, name)
    view["vllm:request_success_total"] = (series(after, "vllm:request_success_total")
                                          - series(before, "vllm:request_success_total"))
    for name in HISTOGRAMS:
        n = series(after, name + "_count") - series(before, name + "_count")
        s = series(after, name + "_sum") - series(before, name + "_sum")
        view[name] = {"count": n, "mean_ms": (s / n * 1e3) if n else None}
    return view


def _stat(metric: dict[str, Any] | None, status: str = "successful") -> float | None:
    """A StatusDistributionSummary's mean for one status (GuideLLM's JSON), or None."""
    if not metric:
        return None
    value = (metric.get(status) or {}).get("mean")
    return float(value) if isinstance(value, (int, float)) else None


def _count(metric: dict[str, Any] | None, status: str = "successful") -> float | None:
    """A StatusDistributionSummary's summed value for one status (total tokens)."""
    if not metric:
        return None
    part = metric.get(status) or {}
    value = part.get("total_sum")
    return float(value) if isinstance(value, (int, float)) else None


def guidellm_rows(report_json: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per benchmark of GuideLLM's JSON report (its own figures, client side)."""
    rows = []
    for bench in report_json.get("benchmarks", []):
        m = bench.get("metrics", {})
        totals = m.get("request_totals") or {}
        strategy = (bench.get("config") or {}).get("strategy") or {}
        kind = strategy.get("type_") or "?"
        if isinstance(strategy.get("rate"), (int, float)):
            kind += f" {strategy['rate']:.2f}/s"
        elif kind == "throughput" and strategy.get("max_concurrency"):
            kind += f"@{strategy['max_concurrency']}"
        rows.append({
            "strategy": kind,
            "successful": totals.get("successful"), "errored": totals.get("errored"),
            "incomplete": totals.get("incomplete"),
            # Rates over all requests, as GuideLLM's "Server Throughput" table gives them;
            # latencies over the requests that completed.
            "req_per_s": _stat(m.get("requests_per_second"), "total"),
            "concurrency": _stat(m.get("request_concurrency"), "total"),
            "output_tok_per_s": _stat(m.get("output_tokens_per_second"), "total"),
            "ttft_ms_mean": _stat(m.get("time_to_first_token_ms")),
            "ttft_ms_p99": ((m.get("time_to_first_token_ms") or {}).get("successful") or {})
            .get("percentiles", {}).get("p99"),
            "itl_ms_mean": _stat(m.get("inter_token_latency_ms")),
            "tpot_ms_mean": _stat(m.get("time_per_output_token_ms")),
            "latency_s_mean": _stat(m.get("request_latency")),
            "prompt_tokens": _count(m.get("prompt_token_count")),
            "output_tokens": _count(m.get("output_token_count")),
            "output_tokens_incomplete": _count(m.get("output_token_count"), "incomplete"),
        })
    return rows


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def served_name(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def run(args: argparse.Namespace, out: Path) -> dict:
    from bench.harness.serve_process import start_server

    exe = find_guidellm(args.guidellm)
    version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             timeout=120).stdout.strip().rpartition(" ")[2]  # "... version: X"
    model = args.model
    if model is None:
        import yaml

        model = yaml.safe_load((ROOT / "config.yaml").read_text())["model"]
    tokenizer = args.tokenizer or (str((ROOT / model).resolve()) if (ROOT / model).is_dir()
                                   else model)
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "guidellm-report.json"
    with tempfile.TemporaryDirectory() as tmp_name:
        proc, url, log = start_server(Path(tmp_name), model, args.device)
        try:
            name = served_name(url)
            cmd = [exe, "run",
                   "--backend", f"kind=openai_http,target={url},model={name},"
                                f"request_format={args.request_format}",
                   "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
                   "--profile", f"kind=sweep,sweep_size={args.sweep_size},"
                                f"max_concurrency={args.max_concurrency}",
                   "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                             f"output_tokens={args.output_tokens}",
                   "--constraint", f"kind=max_duration,seconds={args.max_seconds:g}",
                   "--output", f"kind=json,path={report_path}",
                   "--disable-console-interactive"]
            before = scrape(url)
            t0 = time.monotonic()
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                  timeout=args.sweep_size * (args.max_seconds + 60) + 300)
            wall = time.monotonic() - t0
            time.sleep(1.0)  # the last requests' ends reach the metrics
            after = scrape(url)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            serve_log = log.read_text(errors="replace")[-4000:]
    (out / "guidellm_stdout.txt").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    (out / "serve_log_tail.txt").write_text(serve_log)
    if done.returncode != 0 or not report_path.exists():
        raise SystemExit(f"guidellm exited with {done.returncode}; see "
                         f"{out / 'guidellm_stdout.txt'}:\n{done.stderr[-2000:]}")
    rows = guidellm_rows(json.loads(report_path.read_text()))
    server = server_view(before, after)
    table = report.markdown_table(
        ["strategy", "ok", "errors", "incomplete", "req/s", "concurrency", "out tok/s",
         "TTFT ms mean", "TTFT ms p99", "ITL ms mean", "TPOT ms mean", "latency s mean"],
        [[r["strategy"], _fmt(r["successful"]), _fmt(r["errored"]), _fmt(r["incomplete"]),
          _fmt(r["req_per_s"], 2), _fmt(r["concurrency"]), _fmt(r["output_tok_per_s"]),
          _fmt(r["ttft_ms_mean"]), _fmt(r["ttft_ms_p99"]), _fmt(r["itl_ms_mean"]),
          _fmt(r["tpot_ms_mean"]), _fmt(r["latency_s_mean"], 2)] for r in rows])
    g_ok = sum(r["successful"] or 0 for r in rows)
    g_err = sum(r["errored"] or 0 for r in rows)
    g_out = sum(r["output_tokens"] or 0 for r in rows)
    g_out_inc = sum(r["output_tokens_incomplete"] or 0 for r in rows)
    g_prompt = sum(r["prompt_tokens"] or 0 for r in rows)
    compare = report.markdown_table(
        ["figure (whole sweep)", "GuideLLM (client)", "/metrics (server)"],
        [["requests finished", _fmt(g_ok), _fmt(server["vllm:request_success_total"], 0)],
         ["requests errored / aborted", _fmt(g_err),
          f"{server['gapless:requests_failed_total']:.0f} failed, "
          f"{server['gapless:requests_aborted_total']:.0f} aborted"],
         ["prompt tokens (finished requests)", _fmt(g_prompt, 0),
          _fmt(server["vllm:prompt_tokens_total"], 0)],
         ["output tokens (finished + cut at a benchmark's end)",
          f"{g_out:,.0f} + {g_out_inc:,.0f}", _fmt(server["vllm:generation_tokens_total"], 0)],
         ["TTFT mean ms (all requests)", "per rate above",
          _fmt(server["vllm:time_to_first_token_seconds"]["mean_ms"])],
         ["ITL mean ms", "per rate above",
          _fmt(server["vllm:inter_token_latency_seconds"]["mean_ms"])],
         ["e2e latency mean ms", "per rate above",
          _fmt(server["vllm:e2e_request_latency_seconds"]["mean_ms"])],
         ["queue time mean ms", "-", _fmt(server["vllm:request_queue_time_seconds"]["mean_ms"])]])
    facts = (f"GuideLLM {version}: sweep of {args.sweep_size} x {args.max_seconds:g} s, "
             f"synthetic {args.prompt_tokens} prompt + {args.output_tokens} output tokens, "
             f"{args.request_format}, max concurrency {args.max_concurrency}; served model "
             f"`{name}` ({model}, {args.device}); tokenizer given to GuideLLM: `{tokenizer}`; "
             f"wall {wall:.0f} s; errors {g_err}; load average "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    command = " ".join(cmd)
    data = {"rows": rows, "server": server, "wall_s": wall, "guidellm_version": version,
            "guidellm_command": command, "served_model_name": name, "model": model,
            "tokenizer": tokenizer, "device": args.device, "loadavg": os.getloadavg()}
    report.emit(out, "guidellm", "GuideLLM sweep against engine serve",
                [facts, table, compare, f"GuideLLM command: `{command}`"], data)
    return {"rows": rows, "server": server, "errors": g_err, "wall_s": wall}
