"""Host-clock alignment for device events (DESIGN.md section 4).

Owns the arithmetic that puts a device-side timestamp on the host's
time.perf_counter_ns() axis, so device spans (h2d, compute, d2h) and CPU spans share one
timeline. It is torch-free: the engine makes the CUDA calls and hands over plain numbers.

Approach. CUDA events only give *relative* times: ``a.elapsed_time(b)`` is the milliseconds
from event a to event b on the device. So the engine keeps one *anchor* event:

1. At start, and again whenever the pipeline drains (no work queued on any stream), it
   records the anchor event, synchronises on it, and reads ``time.perf_counter_ns()`` right
   before recording and right after the synchronise returns (``ClockAnchor.from_sync``).
   With the streams idle the event completes as soon as it is recorded, so its host time
   lies inside that bracket; we take the late edge (the sync's return), whose error is the
   wake-up latency of synchronize (microseconds), and keep the bracket width as the
   anchor's stated uncertainty.
2. For each device operation it records timing-enabled events around it, and, only once the
   step's d2h_done has completed (telemetry adds no sync), reads
   ``anchor.elapsed_time(ev)`` (ms) and converts it with ``to_host_ns``.
3. Re-anchoring at every drain bounds drift between the device timer and the host clock:
   both are monotonic but tick from different oscillators (a few ppm apart), which over
   minutes would shift device spans by milliseconds. ``drift_ns`` measures that error when a
   new anchor is taken, if the engine also reads old_anchor.elapsed_time(new_anchor).

It must never call CUDA, never read the clock itself, and never import torch.

``device_ms_ref`` lets the engine keep a single base event and re-anchor without
re-recording it: it is the base event's elapsed_time to this anchor's event, so elapsed
times measured from the base map correctly. With one event per anchor it is 0.0.
"""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.records import Span

NS_PER_MS = 1_000_000


@dataclass(slots=True, frozen=True)
class ClockAnchor:
    """A device instant (``device_ms_ref`` ms after the reference event) known to happen at
    host time ``host_ns`` (perf_counter_ns), give or take ``uncertainty_ns``."""

    host_ns: int
    device_ms_ref: float = 0.0
    uncertainty_ns: int = 0

    @classmethod
    def from_sync(
        cls, before_record_ns: int, after_sync_ns: int, device_ms_ref: float = 0.0
    ) -> ClockAnchor:
        """Anchor from perf_counter_ns() read just before recording the anchor event and just
        after synchronising on it. Uses the late edge; the bracket is the uncertainty."""
        if after_sync_ns < before_record_ns:
            raise ValueError(
                f"after_sync_ns {after_sync_ns} is before before_record_ns {before_record_ns}: "
                "read the clock before recording the event and after synchronising on it"
            )
        return cls(after_sync_ns, device_ms_ref, after_sync_ns - before_record_ns)

    def to_host_ns(self, elapsed_ms: float) -> int:
        """Host time of a device event ``elapsed_ms`` after the reference event (what
        ``reference.elapsed_time(event)`` returns). Negative values (events before the
        anchor) are allowed."""
        return self.host_ns + round((elapsed_ms - self.device_ms_ref) * NS_PER_MS)

    def span(self, lane: str, start_ms: float, end_ms: float) -> Span:
        """A device span from the elapsed times of its start and end events."""
        if end_ms < start_ms:
            raise ValueError(f"span on {lane!r} ends ({end_ms} ms) before it starts ({start_ms})")
        return Span(lane, self.to_host_ns(start_ms), self.to_host_ns(end_ms))

    def drift_ns(self, later: ClockAnchor, elapsed_ms: float) -> int:
        """How far this anchor's mapping has drifted by the time ``later`` was taken.

        ``elapsed_ms`` is the device time of ``later``'s event on this anchor's axis (this
        anchor's reference event's ``elapsed_time`` to it). Positive: the host clock ran
        ahead of the device timer, so device spans mapped through this anchor would be drawn
        too early by this much at that point.
        """
        return later.host_ns - self.to_host_ns(elapsed_ms)
