"""The prefix cache beside KV in use on the Live gauges: hit rate over the window's admissions
(else since start) and prefill tokens saved."""

from __future__ import annotations

import pytest
from test_gauges import titles

from telemetry.records import Span, StepRecord
from ui.figures.gauges import gauge_values, gauges_figure, prefix_line
from ui.figures.timeline import timeline_figure

MS = 1_000_000
STATS = {"running": 1, "waiting": 0, "kv_blocks_used": 2, "kv_blocks_total": 8,
         "prefix_cache_queries": 1000, "prefix_cache_hits": 250}


def rec(n: int, queried: int = 0, cached: int = 0) -> StepRecord:
    return StepRecord(n, "async", 0, 1, queried - cached, 0, queried_tokens=queried,
                      cached_tokens=cached, spans=[Span("compute", n * MS, n * MS + MS // 2)])


def test_hit_rate_of_the_windows_admissions_and_tokens_saved_since_start() -> None:
    v = gauge_values([rec(0, 100, 80), rec(1), rec(2, 100, 60)], (0, 3 * MS), stats=STATS)
    assert v.prefix_hit_rate == pytest.approx(140 / 200)
    assert v.prefill_tokens_saved == 250
    assert prefix_line(v) == "prefix hits 70% · 250 prefill tok saved"


def test_no_admission_in_the_window_falls_back_to_the_engines_counters() -> None:
    v = gauge_values([rec(0), rec(1)], (0, 2 * MS), stats=STATS)
    assert v.prefix_hit_rate == pytest.approx(0.25)
    cold = gauge_values([rec(0)], (0, MS), stats={**STATS, "prefix_cache_queries": 0,
                                                    "prefix_cache_hits": 0})
    assert cold.prefix_hit_rate is None and prefix_line(cold) == "prefix cache: no lookups yet"


@pytest.mark.parametrize("device", [pytest.param("cuda", id="gpu-engine"),
                                    pytest.param("cpu", id="cpu-engine")])
def test_the_kv_gauge_carries_the_prefix_line(device: str) -> None:
    v = gauge_values([rec(0, 100, 80)], (0, MS), stats=STATS)
    fig = gauges_figure(v, device=device)
    (kv,) = [t for t in titles(fig) if t.startswith("KV cache used")]
    assert "prefix hits 80%" in kv and "250 prefill tok saved" in kv


def test_the_timeline_hover_says_a_steps_cached_tokens() -> None:
    fig = timeline_figure([rec(7, queried=120, cached=96)])
    (compute,) = [t for t in fig.data if t.name.split(":")[0] == "compute"]
    assert "prefill 24 · cached 96" in compute.hovertext[0]
