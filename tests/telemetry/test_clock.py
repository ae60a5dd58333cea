"""ClockAnchor: device elapsed milliseconds onto the host perf_counter_ns axis (the arithmetic
behind the engine's CudaClock, checked without a GPU)."""

from __future__ import annotations

import pytest

from telemetry.clock import ClockAnchor


def test_elapsed_ms_maps_to_host_ns() -> None:
    a = ClockAnchor(host_ns=1_000_000_000)
    assert a.to_host_ns(0.0) == 1_000_000_000
    assert a.to_host_ns(1.5) == 1_001_500_000
    assert a.to_host_ns(0.0000004) == 1_000_000_000  # 0.4 ns rounds to the nearest ns
    assert a.to_host_ns(0.0000006) == 1_000_000_001
    assert a.to_host_ns(0.0004) == 1_000_000_400  # CUDA events resolve ~0.5 us
    assert a.to_host_ns(-2.0) == 998_000_000  # an event before the anchor


def test_from_sync_takes_the_late_edge_and_keeps_the_bracket() -> None:
    a = ClockAnchor.from_sync(before_record_ns=100, after_sync_ns=350)
    assert (a.host_ns, a.uncertainty_ns) == (350, 250)
    assert a.to_host_ns(0.001) == 1350
    with pytest.raises(ValueError, match="before"):
        ClockAnchor.from_sync(before_record_ns=350, after_sync_ns=100)
