"""Per-rank telemetry of a step: the collectives' share and the rank's compute span.

Owns `RankStep`, the wrapper a rank runs a step's compute through: it brackets the step with
`TPComm.begin/end` so each collective of the step is timed, and keeps the marks until the step
is known to be done (`done()`); `rank_spans` turns them into spans on the rank's lanes
(telemetry.records.rank_lane). A CUDA-graph replay's `device_events` are passed on, so the
pipeline still times the graph from its first kernel. Adds no host sync: CUDA marks are read
only once their last event has completed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.parallel.comm import Mark, TPComm
from telemetry.records import Span, rank_lane


class RankStep:
    __slots__ = ("fn", "comm", "device_events", "marks", "launched")

    def __init__(self, fn: Callable[[], None], comm: TPComm) -> None:
        self.fn = fn
        self.comm = comm
        self.device_events = getattr(fn, "device_events", None)
        self.marks: list[Mark] = []
        self.launched = False

    def __call__(self) -> None:
        self.comm.begin()
        try:
            self.fn()
        finally:
            self.marks = self.comm.end()
            self.launched = True

    def done(self) -> bool:
        """Its collectives' times can be read (on CUDA: the last one's end event fired)."""
        if not self.launched:
            return False
        if self.comm.cuda and self.marks:
            return bool(self.marks[-1][1].query())
        return True


def rank_spans(rank: int, step: RankStep, to_host_ns: Callable[[Any], int] | None,
               compute: tuple[int, int] | None = None) -> list[Span]:
    """The rank's spans of a done step: one per collective on its comm lane, and its compute
    span (workers; rank 0's is the pipeline's own compute lane)."""
    lane = rank_lane(rank, "comm")
    spans = [Span(lane, a, b) for a, b in TPComm.resolve(step.marks, to_host_ns)]
    if compute is not None:
        spans.append(Span(rank_lane(rank, "compute"), *compute))
    return spans
