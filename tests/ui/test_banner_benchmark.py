"""The banner announces a benchmark that another client of the engine started (the engine's
settings say so) when this dashboard runs none of its own, and says nothing otherwise."""

from __future__ import annotations

from ui.widgets.banner import OTHER_CLIENT_BENCHMARK, benchmark_line


def test_a_benchmark_of_another_client_is_announced():
    assert benchmark_line({"async_batching": True, "benchmark_running": True}) == (
        OTHER_CLIENT_BENCHMARK
    )
    assert benchmark_line({"async_batching": True, "benchmark_running": False}) is None
    assert benchmark_line({"async_batching": True}) is None  # an in-process engine's settings
    assert benchmark_line(None) is None
