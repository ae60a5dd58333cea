"""/metrics exports the async-correctness sentinel's counters while it is on (its mismatch rate
on /metrics is rate(gapless:sentinel_mismatches_total) / rate(gapless:sentinel_checked_total)),
and nothing of it while it is off."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.serving.prometheus import EngineMetrics
from telemetry.bus import TelemetryBus

STATS = {"running": 0, "waiting": 0, "generated_tokens": 10, "preemptions": 0,
         "discarded_tokens": 0, "kv_blocks_used": 0, "kv_blocks_total": 8}


class FakeClient:
    def __init__(self, stats: dict) -> None:
        self._stats, self._bus = stats, TelemetryBus()

    def telemetry(self) -> TelemetryBus:
        return self._bus

    def alive(self) -> bool:
        return True

    def stats(self) -> dict:
        return dict(self._stats)

    def settings(self) -> dict:
        return {"async_batching": True, "num_slots": 2, "cuda_graphs": False}


def _samples(client: FakeClient) -> dict[str, float]:
    m = EngineMetrics(client, "m")
    m.poll()
    return {s.name: s.value for f in text_string_to_metric_families(m.render().decode())
            for s in f.samples}


def test_sentinel_counters_on_metrics_while_it_is_on():
    on = _samples(FakeClient({**STATS, "sentinel_sample_every": 64, "sentinel_checked": 40,
                              "sentinel_mismatches": 1, "sentinel_tokens_checked": 900,
                              "sentinel_tokens_mismatched": 2}))
    assert on["gapless:sentinel_checked_total"] == 40
    assert on["gapless:sentinel_mismatches_total"] == 1
    assert on["gapless:sentinel_tokens_checked_total"] == 900
    assert on["gapless:sentinel_tokens_mismatched_total"] == 2
    off = _samples(FakeClient(STATS))
    assert not any(name.startswith("gapless:sentinel") for name in off)
