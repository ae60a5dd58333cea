"""ClockAnchor: device elapsed milliseconds onto the host perf_counter_ns axis."""

from __future__ import annotations

import pytest

from telemetry.clock import ClockAnchor
from telemetry.records import Span


def test_elapsed_ms_maps_to_host_ns() -> None:
    a = ClockAnchor(host_ns=1_000_000_000)
    assert a.to_host_ns(0.0) == 1_000_000_000
    assert a.to_host_ns(1.5) == 1_001_500_000
    assert a.to_host_ns(0.0000004) == 1_000_000_000  # 0.4 ns rounds to the nearest ns
    assert a.to_host_ns(0.0000006) == 1_000_000_001
    assert a.to_host_ns(0.0004) == 1_000_000_400  # CUDA events resolve ~0.5 us
    assert a.to_host_ns(-2.0) == 998_000_000  # an event before the anchor


def test_reference_offset_for_a_shared_base_event() -> None:
    # The anchor event happened 10 ms after the base event the engine measures from.
    a = ClockAnchor(host_ns=5_000_000, device_ms_ref=10.0)
    assert a.to_host_ns(10.0) == 5_000_000
    assert a.to_host_ns(12.5) == 7_500_000


def test_from_sync_takes_the_late_edge_and_keeps_the_bracket() -> None:
    a = ClockAnchor.from_sync(before_record_ns=100, after_sync_ns=350)
    assert (a.host_ns, a.device_ms_ref, a.uncertainty_ns) == (350, 0.0, 250)
    with pytest.raises(ValueError, match="before"):
        ClockAnchor.from_sync(before_record_ns=350, after_sync_ns=100)


def test_device_span_on_its_lane() -> None:
    a = ClockAnchor(host_ns=2_000_000)
    assert a.span("compute", 0.25, 1.0) == Span("compute", 2_250_000, 3_000_000)
    with pytest.raises(ValueError, match="ends"):
        a.span("d2h", 2.0, 1.0)


def test_drift_between_anchors() -> None:
    first = ClockAnchor(host_ns=0)
    # 1000 ms later on the device, the host read 50 ns more than the mapping predicts.
    later = ClockAnchor(host_ns=1_000_000_050)
    assert first.drift_ns(later, 1000.0) == 50
    assert first.drift_ns(ClockAnchor(host_ns=999_999_980), 1000.0) == -20
