"""bench guidellm's reading of GuideLLM's JSON report and of two /metrics scrapes (no GuideLLM
or server needed: the shapes are GuideLLM 0.8.1's, trimmed to the fields the suite reads)."""

from __future__ import annotations

import pytest

from bench.suites.guidellm import find_guidellm, guidellm_rows, server_view


def dist(successful: float, total: float | None = None, incomplete_sum: float = 0.0) -> dict:
    return {"successful": {"mean": successful, "total_sum": successful * 2,
                           "percentiles": {"p99": successful + 1}},
            "incomplete": {"mean": 0.0, "total_sum": incomplete_sum},
            "total": {"mean": successful if total is None else total}}


def bench(strategy: dict, ok: int, incomplete: int) -> dict:
    return {"config": {"strategy": strategy},
            "metrics": {"request_totals": {"successful": ok, "errored": 0,
                                           "incomplete": incomplete, "total": ok + incomplete},
                        "requests_per_second": dist(0.5, total=0.75),
                        "request_concurrency": dist(1.0),
                        "output_tokens_per_second": dist(10.0, total=12.0),
                        "time_to_first_token_ms": dist(100.0),
                        "inter_token_latency_ms": dist(20.0),
                        "time_per_output_token_ms": dist(25.0),
                        "request_latency": dist(1.5),
                        "prompt_token_count": dist(64.0),
                        "output_token_count": dist(32.0, incomplete_sum=7.0)}}


def test_rows_name_each_strategy_and_take_rates_over_all_requests():
    report = {"benchmarks": [
        bench({"type_": "synchronous"}, 4, 1),
        bench({"type_": "throughput", "max_concurrency": 16}, 16, 16),
        bench({"type_": "constant", "rate": 0.1667}, 5, 5)]}
    rows = guidellm_rows(report)
    assert [r["strategy"] for r in rows] == ["synchronous", "throughput@16", "constant 0.17/s"]
    r = rows[0]
    assert (r["successful"], r["errored"], r["incomplete"]) == (4, 0, 1)
    assert r["req_per_s"] == 0.75 and r["output_tok_per_s"] == 12.0  # "total", not "successful"
    assert r["ttft_ms_mean"] == 100.0 and r["ttft_ms_p99"] == 101.0  # completed requests
    assert r["output_tokens"] == 64.0 and r["output_tokens_incomplete"] == 7.0


def test_server_view_is_the_difference_of_two_scrapes_over_all_label_sets():
    m = 'model_name="m"'
    before = {f"vllm:generation_tokens_total{{{m}}}": 10.0,
              f'vllm:request_success_total{{finished_reason="length",{m}}}': 1.0,
              f"vllm:time_to_first_token_seconds_count{{{m}}}": 1.0,
              f"vllm:time_to_first_token_seconds_sum{{{m}}}": 0.5}
    after = {f"vllm:generation_tokens_total{{{m}}}": 42.0,
             f'vllm:request_success_total{{finished_reason="length",{m}}}': 3.0,
             f'vllm:request_success_total{{finished_reason="stop",{m}}}': 1.0,
             f"vllm:time_to_first_token_seconds_count{{{m}}}": 5.0,
             f"vllm:time_to_first_token_seconds_sum{{{m}}}": 2.5,
             "gapless:requests_aborted_total": 2.0}
    view = server_view(before, after)
    assert view["vllm:generation_tokens_total"] == 32.0
    assert view["vllm:request_success_total"] == 3.0
    assert view["gapless:requests_aborted_total"] == 2.0
    assert view["vllm:time_to_first_token_seconds"] == {"count": 4.0, "mean_ms": 500.0}
    assert view["vllm:e2e_request_latency_seconds"] == {"count": 0.0, "mean_ms": None}


def test_a_missing_guidellm_says_how_to_install_it(tmp_path):
    with pytest.raises(SystemExit, match="pip install guidellm=="):
        find_guidellm(str(tmp_path / "no-such-guidellm"))
