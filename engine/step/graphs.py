"""CUDA graphs of the compute step, one per (slot, token-count bucket, greedy-only).

Owns capture, lookup and the fallback policy: a step is padded up to the smallest bucket
that holds it; a step above the largest bucket runs eagerly; if capture fails (out of
memory, an op that cannot be captured) graphs are switched off with the reason kept, and the
engine keeps serving eagerly. All graphs share one memory pool: they never run concurrently
because every step is serialised on the compute stream.

Each graph also carries two timing events recorded inside it (``external=True``), at its
first kernel and after its last: `replay_fn` hands them to the pipeline with the replay, so a
step's compute span runs from its first kernel to its last, not from when the stream reached
the launch (docs/design.md section 4). The first event follows a one-element marker kernel,
not the graph's start: an event node at the head of a graph fires well before the first
kernel runs when the graph is launched onto an idle stream (sync mode), because the graph's
kernels are still being launched; the event after a kernel fires once kernels run. The
marker costs one tiny kernel per replay, and the events are read only once the step's
results are in: no host sync. The marker kernel itself lies before the span: profilers see
it as the graph's first kernel, so the anatomy and the kernel sampler know it by name
(``bitwise_not``) and leave it out of the step (our span starts after the profiler's first
kernel by the marker's duration and the gap after it).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import Protocol

import torch

from engine.step.runner import DeviceView

log = logging.getLogger("gapless.graphs")

GraphKey = tuple[int, int, bool]  # (slot index, token bucket, greedy only)

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def default_buckets(max_num_batched_tokens: int) -> list[int]:
    """Buckets up to the token budget (and at most 512: bigger steps are compute-bound,
    where launch gaps matter little)."""
    out = [b for b in DEFAULT_BUCKETS if b < max_num_batched_tokens]
    if max_num_batched_tokens <= DEFAULT_BUCKETS[-1]:
        out.append(max_num_batched_tokens)
    return out


class Graph(Protocol):
    def replay(self) -> None: ...


class GraphReplay:
    """Replays one captured graph when called; ``device_events`` are the (first, last)
    timing events recorded inside it, valid until the same graph is replayed again."""

    __slots__ = ("graph", "device_events")

    def __init__(self, graph: Graph,
                 device_events: tuple[torch.cuda.Event, torch.cuda.Event] | None) -> None:
        self.graph = graph
        self.device_events = device_events

    def __call__(self) -> None:
        self.graph.replay()


class GraphCache:
    def __init__(
        self,
        buckets: list[int],
        compute: Callable[[DeviceView, int, int, bool], None],
        stream: torch.cuda.Stream | None,
        max_samples: int,
        timing: bool = True,
    ) -> None:
        self.buckets = sorted(set(buckets))
        # With telemetry off no timing events are captured into the graphs.
        self.timing = timing
        self._compute = compute
        self._stream = stream
        self._max_samples = max_samples
        self._pool: object | None = None  # made at the first capture
        self._marker: torch.Tensor | None = None  # the start-marker kernel's one element
        self._graphs: dict[GraphKey, Graph] = {}
        self._events: dict[GraphKey, tuple[torch.cuda.Event, torch.cuda.Event]] = {}
        self._last_events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        self.failure: str | None = None

    def bucket_for(self, num_tokens: int) -> int | None:
        i = bisect.bisect_left(self.buckets, num_tokens)
        return self.buckets[i] if i < len(self.buckets) else None

    def captured(self) -> set[GraphKey]:
        """(slot index, bucket, greedy_only) of every graph held."""
        return set(self._graphs)

    def capture_all(self, slots: list[tuple[int, DeviceView]]) -> bool:
        """Capture every bucket for every slot (what is held already is kept). On failure,
        keep the reason and return False."""
        try:
            for index, view in slots:
                for bucket in self.buckets:
                    for greedy in (True, False):
                        key = (index, bucket, greedy)
                        if key not in self._graphs:
                            self._last_events = None
                            self._graphs[key] = self._capture(view, bucket, greedy)
                            if self._last_events is not None:
                                self._events[key] = self._last_events
        except Exception as e:  # capture can fail in many ways; serve eagerly instead
            self.failure = f"CUDA graph capture failed ({type(e).__name__}: {e})"
            log.warning("%s; running eagerly", self.failure)
            self._graphs.clear()
            self._events.clear()
            return False
        return True

    def _capture(self, view: DeviceView, bucket: int, greedy: bool) -> Graph:
        """The CUDA work of one capture. The view holds a padded dummy step (all tokens point
        at scratch), so warm-up and capture read valid indices. The graph's in-graph timing
        events are left in ``_last_events``."""
        assert self._stream is not None
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self._last_events = None
        with torch.cuda.stream(self._stream):
            for _ in range(2):
                self._compute(view, bucket, self._max_samples, greedy)
        self._stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        first = torch.cuda.Event(enable_timing=True, external=True) if self.timing else None
        last = torch.cuda.Event(enable_timing=True, external=True) if self.timing else None
        if first is not None and self._marker is None:
            self._marker = torch.zeros(1, dtype=torch.int32, device=self._stream.device)
        with torch.cuda.graph(graph, pool=self._pool, stream=self._stream):
            if first is not None:
                # The first kernel: `first` fires when kernels run. bitwise_not_ so that its
                # kernel is known by name (telemetry.kernels: family "marker"): it is ours,
                # before the step's span, and the anatomy leaves it out of the step.
                self._marker.bitwise_not_()
                first.record()
            self._compute(view, bucket, self._max_samples, greedy)
            if last is not None:
                last.record()
        self._stream.synchronize()
        if first is not None and last is not None:
            self._last_events = (first, last)
        return graph

    def replay(self, index: int, bucket: int, greedy: bool) -> None:
        self._graphs[(index, bucket, greedy)].replay()

    def replay_fn(self, index: int, bucket: int, greedy: bool) -> GraphReplay:
        """The replay of one graph as a callable that also carries its in-graph timing
        events (``device_events``), for the pipeline's timed compute op."""
        key = (index, bucket, greedy)
        return GraphReplay(self._graphs[key], self._events.get(key))

    def drop_slots_from(self, index: int) -> None:
        """Forget the graphs of slots >= index (those slots were removed). A graph holds raw
        pointers to its slot's buffers: a later slot with the same index has new buffers
        and must be captured afresh."""
        for key in [k for k in self._graphs if k[0] >= index]:
            del self._graphs[key]
            self._events.pop(key, None)
