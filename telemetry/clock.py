"""Host-clock alignment for device events (docs/design.md section 4).

Owns the arithmetic that puts a device-side timestamp on the host's
time.perf_counter_ns() axis, so device spans (h2d, compute, d2h) and CPU spans share one
timeline. It is torch-free: the engine makes the CUDA calls and hands over plain numbers.

Approach. CUDA events only give *relative* times: ``a.elapsed_time(b)`` is the milliseconds
from event a to event b on the device. So the engine keeps one *anchor* event:

1. At start (when the stream set is made), and again at each live-settings change (the loop
   drains the pipeline first: no work queued on any stream), it records the anchor event,
   synchronises on it, and reads ``time.perf_counter_ns()`` right before recording and right
   after the synchronise returns (``ClockAnchor.from_sync``).
   With the streams idle the event completes as soon as it is recorded, so its host time
   lies inside that bracket; we take the late edge (the sync's return), whose error is the
   wake-up latency of synchronize (microseconds), and keep the bracket width as the
   anchor's stated uncertainty.
2. For each device operation it records timing-enabled events around it, and, only once the
   step's d2h_done has completed (telemetry adds no sync), reads
   ``anchor.elapsed_time(ev)`` (ms) and converts it with ``to_host_ns``.
3. The device timer and the host clock are both monotonic but tick from different
   oscillators, a few ppm apart: between two anchors the mapping drifts by that much (a few
   microseconds a second). A run with no live change keeps its start's anchor.

The engine's CudaClock (engine/step/streams.py) is the one user: it makes the CUDA calls.
This module must never call CUDA, never read the clock itself, and never import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

NS_PER_MS = 1_000_000


@dataclass(slots=True, frozen=True)
class ClockAnchor:
    """The anchor event happened at host time ``host_ns`` (perf_counter_ns), give or take
    ``uncertainty_ns``."""

    host_ns: int
    uncertainty_ns: int = 0

    @classmethod
    def from_sync(cls, before_record_ns: int, after_sync_ns: int) -> ClockAnchor:
        """Anchor from perf_counter_ns() read just before recording the anchor event and just
        after synchronising on it. Uses the late edge; the bracket is the uncertainty."""
        if after_sync_ns < before_record_ns:
            raise ValueError(
                f"after_sync_ns {after_sync_ns} is before before_record_ns {before_record_ns}: "
                "read the clock before recording the event and after synchronising on it"
            )
        return cls(after_sync_ns, after_sync_ns - before_record_ns)

    def to_host_ns(self, elapsed_ms: float) -> int:
        """Host time of a device event ``elapsed_ms`` after the anchor event (what
        ``anchor.elapsed_time(event)`` returns). Negative values (events before the anchor)
        are allowed."""
        return self.host_ns + round(elapsed_ms * NS_PER_MS)
