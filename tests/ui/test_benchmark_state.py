"""The Benchmark page says the truth at each moment: the run's label
follows the engine's mode as soon as the previous run is in (not after the next one's
warm-up), and the Run button follows a load stopped from another tab without a reload."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import streamlit as st
from fake_engine import FakeEngineClient
from test_pages_fake import app

import ui.widgets.bench_runner
from engine.drivers.workload import BenchmarkProgress, BenchmarkResult, BenchmarkSpec
from ui.widgets.bench_runner import BenchmarkRun, alternated


def result(label: str) -> BenchmarkResult:
    return BenchmarkResult(label, settings={}, num_steps=0, total_s=1.0, tokens_per_s=1.0,
                           gpu_busy=0.5, idle_total_s=0.0, idle_gaps=0, records=[])


class SlowWarmupClient:
    """Run 1 finishes; run 2 then warms up (no item) until ``go`` is set."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.warming = threading.Event()

    def stats(self) -> dict[str, int]:
        return {"generated_tokens": 0}

    def run_benchmark(self, spec: Any) -> Iterator[Any]:
        yield BenchmarkProgress("sync #1", 2, 2)
        yield result("sync #1")
        self.warming.set()
        self.go.wait(10)  # the engine switched to async and warms up: nothing is yielded
        yield BenchmarkProgress("async #1", 0, 2)
        yield result("async #1")


def test_the_label_names_the_next_run_while_it_warms_up() -> None:
    client = SlowWarmupClient()
    spec = BenchmarkSpec(num_requests=2, prompt_len=4, max_tokens=4,
                         modes=alternated([{"async_batching": False},
                                           {"async_batching": True}], 1))
    run = BenchmarkRun(client, spec).start()
    try:
        assert client.warming.wait(10)
        with run.lock:
            p = run.progress
            assert (p.run_index, p.label, p.phase, p.done) == (1, "async #1", "warming up", 0)
    finally:
        client.go.set()
        assert run._thread is not None
        run._thread.join(10)
    assert run.progress.phase == "measuring" and run.progress.run_index == 2


def test_the_first_run_is_named_before_any_item_comes() -> None:
    client = SlowWarmupClient()
    spec = BenchmarkSpec(modes=alternated([{"async_batching": False}], 1))
    run = BenchmarkRun(client, spec)
    run.progress.label = ""
    run._next_run(0)
    assert run.progress.label == "sync #1" and run.progress.phase == "warming up"


def test_the_run_button_is_redrawn_every_second_and_follows_the_load(
    fake: FakeEngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = st.fragment
    seen: list[tuple[str, Any]] = []

    def spy(func: Any = None, *, run_every: Any = None) -> Any:
        if func is None:
            def wrap(f: Any) -> Any:
                seen.append((f.__name__, run_every))
                return real(f, run_every=run_every)
            return wrap
        seen.append((func.__name__, run_every))
        return real(func, run_every=run_every)

    monkeypatch.setattr(st, "fragment", spy)
    fake.start_load(None)
    at = app().run()
    at.switch_page("ui/pages/benchmark.py").run()
    assert at.button(key="bench.run").disabled
    assert ("run_controls", 1.0) in seen  # re-read every second, not only on a reload
    fake.stop_load()  # from another tab
    at.run()
    assert not at.button(key="bench.run").disabled
    assert not at.exception
    ui.widgets.bench_runner.RUNS.current = None
