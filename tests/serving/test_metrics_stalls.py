"""/metrics counts the stalls the engine names: gapless:stalls_total{cause} (every cause at 0
from the start) and gapless:stall_max_seconds, the longest stall's interval. On hand-made
records, and on a real `engine serve` whose step threads are kept off their CPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from descheduling import keep_off_cpu
from prometheus_client.parser import text_string_to_metric_families
from serve_process import MODEL, metric, wait_idle, wait_scrape

from engine.serving.prometheus import EngineMetrics
from telemetry.bus import TelemetryBus
from telemetry.records import Span, StepRecord
from telemetry.stalls import CPU_DESCHEDULED, GC, STALL_CAUSE_NAMES

MS = 1_000_000


class FakeClient:
    def __init__(self) -> None:
        self.bus = TelemetryBus()

    def telemetry(self) -> TelemetryBus:
        return self.bus

    def alive(self) -> bool:
        return True

    def stats(self) -> None:
        return None

    def settings(self) -> None:
        return None


def step(n: int, stall: str = "", stall_ms: int = 0) -> StepRecord:
    t = (100 + 10 * n) * MS
    return StepRecord(step=n, mode="async", slot=0, num_requests=1, prefill_tokens=0,
                      decode_tokens=1, spans=[Span("compute", t, t + MS)], stall=stall,
                      stall_ns=stall_ms * MS)


def samples(m: EngineMetrics) -> dict[tuple[str, tuple], float]:
    m.poll(with_engine=False)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}


def test_stalls_by_cause_and_the_longest_on_hand_made_records():
    client = FakeClient()
    m = EngineMetrics(client, "m")
    before = samples(m)
    assert all(metric(before, "gapless:stalls_total", cause=c) == 0 for c in STALL_CAUSE_NAMES)
    assert metric(before, "gapless:stall_max_seconds") == 0
    for rec in (step(0), step(1, GC, 120), step(2), step(3, GC, 40), step(4, CPU_DESCHEDULED, 70)):
        client.bus.publish_step(rec)
    after = samples(m)
    assert metric(after, "gapless:stalls_total", cause=GC) == 2
    assert metric(after, "gapless:stalls_total", cause=CPU_DESCHEDULED) == 1
    assert metric(after, "gapless:stalls_total") == 3
    assert metric(after, "gapless:stall_max_seconds") == 0.12


def engine_threads(pid: int) -> list[int]:
    """The engine process's loop thread, the thread that runs its compute on the CPU, and the
    threads those started (torch's intra-op pool takes its creator's name)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() in ("gapless-engine", "gapless-compute"):
                out.append(int(task.name))
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def test_serve_counts_a_stall_of_its_engine(server, oai):
    """A stream runs; for a second the engine's step threads are kept off their CPU
    (tests/descheduling.py), so its steps wait in the run queue: /metrics counts
    cpu_descheduled stalls."""
    before = wait_idle(server.url)
    was = metric(before, "gapless:stalls_total", cause=CPU_DESCHEDULED)
    threads = engine_threads(server.engine_pid())
    assert len(threads) >= 2, threads
    done = threading.Event()

    def stream() -> None:
        try:
            oai.completions.create(model=MODEL, prompt="def f(x):\n", max_tokens=900,
                                   temperature=0.0, extra_body={"ignore_eos": True})
        finally:
            done.set()

    runner = threading.Thread(target=stream, daemon=True)
    runner.start()
    wait_scrape(server.url, lambda s: metric(s, "vllm:num_requests_running") >= 1,
                "the stream running")
    time.sleep(0.5)  # steps of its kind to judge against
    keep_off_cpu(threads, 1.0)
    assert done.wait(120)
    after = wait_scrape(server.url, lambda s: metric(s, "gapless:stalls_total",
                                                     cause=CPU_DESCHEDULED) > was,
                        "a cpu_descheduled stall counted")
    assert metric(after, "gapless:stall_max_seconds") > 0
