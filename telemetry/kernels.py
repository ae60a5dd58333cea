"""Measured kernels of sampled steps: the records, their families, and kernel busy from them.

Owns the shape of what the always-on kernel sampler (engine/instruments/kernel_sampler.py)
publishes: a `KernelSample` per sampled run of consecutive steps, each step's kernels with
their real start and end on the host clock (time.perf_counter_ns), and the arithmetic that
turns them into *kernel busy* (time inside kernels / time): the union of kernel intervals
over a window that runs from one sampled step's first kernel to the first kernel of the step
after the last one counted, so a sample measures whole step periods (inter-step idle
included) and not one step's inside.

A kernel's family is telemetry.kernel_family's (the one classifier every view shares).

Pure: it must never import torch, a profiler or anything of ours beyond telemetry, nor read
a clock. Conversion from a profiler's trace happens in the engine (on a worker thread).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from telemetry.kernel_family import family_of
from telemetry.metrics import union_length


@dataclass(slots=True, frozen=True)
class KernelRecord:
    """One kernel (or device copy) as the device ran it, host-clock nanoseconds."""

    name: str
    family: str
    start_ns: int
    end_ns: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(slots=True)
class SampledStep:
    """One sampled step's kernels (on its compute stream), in start order."""

    step: int
    kernels: list[KernelRecord] = field(default_factory=list)

    @property
    def work(self) -> list[KernelRecord]:
        """The model's kernels: the graph start marker left out."""
        return [k for k in self.kernels if k.family != "marker"]

    @property
    def start_ns(self) -> int:
        return min(k.start_ns for k in self.kernels)

    @property
    def end_ns(self) -> int:
        return max(k.end_ns for k in self.kernels)

    @property
    def kernel_ns(self) -> int:
        return union_length((k.start_ns, k.end_ns) for k in self.kernels)


@dataclass(slots=True)
class KernelSample:
    """A run of consecutive sampled steps. ``window`` is (start, end) ns: from the first
    step's first kernel to the first kernel of the step after the last counted one;
    ``kernel_ns`` the union of kernel time inside it. ``aligned`` says how the steps were
    found in the trace and put on our clock: "brackets" (CUDA runtime calls around each
    launch) or "ranges" (profiler ranges, the fallback); engine/instruments/kernel_sampler.py."""

    steps: list[SampledStep]
    window: tuple[int, int]
    kernel_ns: int
    aligned: str = "clock"
    cost_ns: int = 0  # loop-thread time the sample took (profiler start + stop)
    # GPU idle inside the window while the loop thread was in the sampler's own bracket
    # launches: time the sampler added to its steps, not the engine's (left out of busy)
    bracket_idle_ns: int = 0
    # Sampled steps left out because the profiler dropped some of their kernels, and the
    # kernel launches it kept no record of (engine/instruments/kernel_sampler.py)
    skipped_steps: int = 0
    lost_launches: int = 0

    @property
    def busy(self) -> float:
        lo, hi = self.window
        w = hi - lo - self.bracket_idle_ns
        return self.kernel_ns / w if w > 0 else 0.0


def idle_overlap_ns(spans: Iterable[tuple[int, int]], busy: Sequence[tuple[int, int]],
                    lo: int, hi: int) -> int:
    """How much of ``spans`` (disjoint) falls inside [lo, hi) but outside every ``busy``
    interval: the GPU's idle time during them."""
    total = 0
    for a, b in spans:
        a, b = max(a, lo), min(b, hi)
        if b <= a:
            continue
        covered = union_length((max(x, a), min(y, b)) for x, y in busy if y > a and x < b)
        total += (b - a) - covered
    return total


def make_sample(steps: Sequence[SampledStep], next_start_ns: int | None,
                aligned: str = "clock", cost_ns: int = 0,
                brackets: Sequence[tuple[int, int]] = ()) -> KernelSample | None:
    """A sample of ``steps`` (consecutive, with kernels). Its window ends at the next step's
    first kernel (``next_start_ns``) when known, else at the last kernel's end. None when no
    step has kernels. ``brackets``: the host intervals of the sampler's own launches around
    each step; the GPU idle time they overlap is kept apart (``bracket_idle_ns``)."""
    steps = sorted((s for s in steps if s.kernels), key=lambda s: s.step)
    if not steps:
        return None
    lo = steps[0].start_ns
    hi = next_start_ns if next_start_ns is not None and next_start_ns > lo else max(
        s.end_ns for s in steps)
    clipped = [(max(k.start_ns, lo), min(k.end_ns, hi)) for s in steps for k in s.kernels
               if k.end_ns > lo and k.start_ns < hi]
    return KernelSample(list(steps), (lo, hi), union_length(clipped), aligned, cost_ns,
                        idle_overlap_ns(brackets, clipped, lo, hi))


def kernel_busy(samples: Iterable[KernelSample]) -> float | None:
    """Kernel busy over sampled windows: their kernel time over their time, less the GPU
    idle the sampler's own bracket launches caused. None without samples."""
    k = w = 0
    for s in samples:
        k += s.kernel_ns
        w += s.window[1] - s.window[0] - s.bracket_idle_ns
    return k / w if w > 0 else None


def kernel_fraction(samples: Iterable[KernelSample]) -> float | None:
    """Of sampled steps' spans (first kernel to last), the share spent inside kernels: the
    factor that turns a window's step busy into kernel time (telemetry.waterfall)."""
    k = span = 0
    for s in samples:
        for st in s.steps:
            work = st.work or st.kernels
            span += max(k_.end_ns for k_ in work) - min(k_.start_ns for k_ in work)
            k += union_length((k_.start_ns, k_.end_ns) for k_ in work)
    return k / span if span else None


def family_time_ns(samples: Iterable[KernelSample]) -> dict[str, int]:
    """Summed kernel time per family over the sampled steps."""
    out: dict[str, int] = {}
    for s in samples:
        for st in s.steps:
            for k in st.kernels:
                out[k.family] = out.get(k.family, 0) + k.duration_ns
    return out


def sample_from_dict(d: dict) -> KernelSample:
    """A KernelSample back from its JSON form (dataclasses.asdict, as telemetry/export.py
    writes it). Each kernel's family is told again from its name, so a recording made under
    older rules shows today's families."""
    steps = [SampledStep(int(s["step"]), [
        KernelRecord(str(k["name"]), family_of(str(k["name"])), int(k["start_ns"]),
                     int(k["end_ns"])) for k in s["kernels"]]) for s in d["steps"]]
    lo, hi = d["window"]
    return KernelSample(steps, (int(lo), int(hi)), int(d["kernel_ns"]),
                        str(d.get("aligned", "")), int(d.get("cost_ns", 0)),
                        int(d.get("bracket_idle_ns", 0)), int(d.get("skipped_steps", 0)),
                        int(d.get("lost_launches", 0)))


def sampled_step_periods(records: Sequence[Any], samples: Sequence[KernelSample],
                         ) -> dict[str, Any]:
    """Whether sampled steps ran like the others (median compute-start to compute-start, us,
    of sampled and of other steps) and how many kernels each sampled step was given."""
    starts = {r.step: min(s.start_ns for s in r.spans if s.lane == "compute")
              for r in records if any(s.lane == "compute" for s in r.spans)}
    period = {n: starts[n + 1] - t for n, t in starts.items() if n + 1 in starts}
    mine = {st.step for s in samples for st in s.steps}
    near = mine | {n - 1 for n in mine} | {n + 1 for n in mine}

    def med(xs: list[int]) -> float | None:
        return round(statistics.median(xs) / 1e3, 1) if xs else None

    other = [p for n, p in period.items() if n not in near]
    steps = [st for s in samples for st in s.steps]
    # Kernel time per step (sampled) over the period of steps the profiler did not slow down:
    # the busy of unperturbed steps, if kernels take as long with or without it (a graph's
    # run back to back). An estimate beside the measured figure (not run on a GPU yet).
    unperturbed = (sum(st.kernel_ns for st in steps) / len(steps) / statistics.median(other)
                   if steps and other else None)
    return {"period_us_sampled": med([p for n, p in period.items() if n in mine]),
            "period_us_other": med(other), "busy_unperturbed_estimate": unperturbed,
            "kernels_per_sampled_step": [len(st.kernels) for s in samples[:2]
                                         for st in s.steps],
            "kernel_us_per_sampled_step": [round(st.kernel_ns / 1e3, 1) for s in samples[:2]
                                           for st in s.steps]}
