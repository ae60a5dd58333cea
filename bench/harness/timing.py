"""Timing for benchmarks: a wall-clock timer that synchronises the device at both ends, a
CUDA-graph timer for single kernels, and A/B comparisons run as alternated pairs (A B, B A,
A B, ...) summarised by median and spread, so a slow drift of the machine (clocks, another
tenant) lands on both sides; the change of B over A and its 95% interval are
telemetry.verdict's, the dashboard's rule.

Owns no workload and prints nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from telemetry.verdict import Interval, paired_change


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for queued device work (no-op on a CPU)."""
    dev = torch.device(device) if device is not None else None
    if (dev is None or dev.type == "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


class Timer:
    """`with Timer(device) as t: ...` then `t.seconds`: synced before and after the block."""

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._t0


def timed(fn: Callable[[], object], device: str | torch.device | None = None) -> float:
    """Seconds `fn()` takes, synced."""
    with Timer(device) as t:
        fn()
    return t.seconds


@dataclass(slots=True)
class Samples:
    """Repeated measurements of one quantity."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the repeats landed."""
        m = self.median
        return (max(self.values) - min(self.values)) / m if m else 0.0

    def summary(self) -> dict:
        return {"median": self.median, "min": min(self.values), "max": max(self.values),
                "spread": self.spread, "n": len(self.values)}


@dataclass(slots=True)
class PairResult:
    a: Samples
    b: Samples
    ratios: Samples  # b / a of each pair

    @property
    def change(self) -> Interval | None:
        """B over A in %, with its 95% interval over the pairs (None under three pairs)."""
        return paired_change(self.a.values, self.b.values)

    def summary(self) -> dict:
        c = self.change
        return {"a": self.a.summary(), "b": self.b.summary(), "b_over_a": self.ratios.summary(),
                "change_pct": None if c is None else {"estimate": c.estimate, "lo": c.lo,
                                                      "hi": c.hi}}


def alternated_pairs(run_a: Callable[[], float], run_b: Callable[[], float],
                     pairs: int) -> PairResult:
    """Run A and B `pairs` times each, alternating which goes first (A B, B A, ...); each
    callable returns its own measurement (seconds, tok/s, ...)."""
    a, b, ratios = Samples(), Samples(), Samples()
    for i in range(pairs):
        if i % 2 == 0:
            va, vb = run_a(), run_b()
        else:
            vb, va = run_b(), run_a()
        a.values.append(va)
        b.values.append(vb)
        ratios.values.append(vb / va if va else float("nan"))
    return PairResult(a, b, ratios)


def graph_seconds_per_call(fn: Callable[[int], object], n_copies: int, reps: int) -> float:
    """Seconds per call of fn(i) on a CUDA device, from one CUDA graph of ``reps`` calls (no
    launch overhead), i cycling through 0..n_copies-1 so the caller can pick one of several
    weight copies too large together for L2. Two warm-up calls on the capture stream first."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            fn(i % n_copies)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(reps):
            fn(i % n_copies)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / (3 * reps)
