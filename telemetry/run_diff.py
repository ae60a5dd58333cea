"""Two runs diffed step by step: step times by kind and batch size, the waterfall, kernel
families, and what the two runs do not share.

Owns the arithmetic of the Diff page. A run is a window of step records (a recording's mode,
a whole recording, or a window of the live engine) with the facts known about where it ran
(device, model, workload, ...). The diff holds:

- **step time by step kind and batch size**: a step's time is its period, from the previous
  step's end to its own end (the cadence a running request sees, as telemetry.verdict reads
  decode-only steps); the kind is "decode-only" or "with prefill" (it carried a prefill
  chunk); the batch is the step's request count (binned by powers of two when there are
  many sizes). Each group's medians are compared with telemetry.verdict's interval;
- **the floor-to-wall waterfall** of each side (telemetry.waterfall), per step. Without
  kernel samples the step busy is one part, not split into floor, kernels and gaps;
- **kernel-family time per sampled step** (telemetry.kernels, families from
  telemetry.kernel_family), where a side carries kernel samples (a GPU run);
- **what is not comparable**: device, model, workload, mode, CUDA graphs, batch sizes seen,
  each said with its two values; step times of two devices or two models are each run's own.

The verdict's statistics and words are telemetry.verdict's: this module never computes an
interval. Pure: numpy and telemetry only; it must never import streamlit, plotly, torch or
the engine, and never change a record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from telemetry.kernel_family import FAMILIES
from telemetry.kernels import KernelSample, family_time_ns
from telemetry.records import StepRecord
from telemetry.verdict import DecodeVerdict, Verdict, decode_verdict, median_verdict
from telemetry.waterfall import COMPONENTS, UNSPLIT, waterfall

DECODE_ONLY = "decode-only"
WITH_PREFILL = "with prefill"
KINDS: tuple[str, ...] = (DECODE_ONLY, WITH_PREFILL)
MAX_BATCH_GROUPS = 8  # more distinct batch sizes than this are binned by powers of two

# A recording's meta keys (bench/suites/record_timeline.py writes them) and the facet each
# one fills; a live window's facts use the same facet names.
RECORDING_FACTS: dict[str, str] = {"machine": "device", "model": "model",
                                   "workload": "workload", "commit": "commit",
                                   "torch": "torch", "date": "date"}
# Facets that make absolute step times incomparable: each run's are its own.
NOT_COMPARABLE = ("device", "model")
# Facets that change what a step costs: usually the one thing a diff is meant to compare.
SETTINGS = ("workload", "mode", "CUDA graphs")
CONTEXT = ("commit", "torch", "date")
FACETS: tuple[str, ...] = (*NOT_COMPARABLE, *SETTINGS, "batch sizes", *CONTEXT)


@dataclass(slots=True)
class Run:
    """One side of a diff: a window of step records (in step order) and the facts known
    about where it ran (facet name -> value; a facet not known is left out)."""

    label: str
    records: list[StepRecord]
    facts: dict[str, str] = field(default_factory=dict)


def recording_facts(meta: Mapping[str, Any]) -> dict[str, str]:
    """A recording's meta line as facts (RECORDING_FACTS), the values it has only."""
    return {facet: str(meta[key]) for key, facet in RECORDING_FACTS.items() if meta.get(key)}


def step_kind(r: StepRecord) -> str:
    return WITH_PREFILL if r.prefill_tokens > 0 else DECODE_ONLY


@dataclass(slots=True, frozen=True)
class StepTime:
    step: int
    kind: str
    batch: int  # requests in the step
    ms: float  # from the previous step's end to this step's end


def step_times(records: Sequence[StepRecord]) -> list[StepTime]:
    """Each step's time, in step order. A step whose predecessor is not in ``records`` (the
    window's first, or one after a gap in step numbers) has no period and is left out."""
    recs = sorted((r for r in records if r.spans), key=lambda r: r.step)
    out = []
    for prev, r in zip(recs, recs[1:], strict=False):
        if r.step != prev.step + 1:
            continue
        ms = (r.end_ns - prev.end_ns) / 1e6
        if ms > 0:
            out.append(StepTime(r.step, step_kind(r), r.num_requests, ms))
    return out


def batch_labels(sizes: Sequence[int]) -> dict[int, str]:
    """The group label of each batch size: the size itself, or its power-of-two range
    ("17-32") when there are more than MAX_BATCH_GROUPS distinct sizes."""
    distinct = sorted(set(sizes))
    if len(distinct) <= MAX_BATCH_GROUPS:
        return {n: str(n) for n in distinct}
    out = {}
    for n in distinct:
        top = 1 << max(0, int(n) - 1).bit_length()
        low = top // 2 + 1 if top > 1 else 1
        out[n] = str(top) if low == top else f"{low}-{top}"
    return out


def label_order(label: str) -> int:
    return int(label.split("-")[-1])


@dataclass(slots=True)
class GroupDiff:
    """One (kind, batch) group: each side's step times (ms, in step order) and the verdict
    on their medians (telemetry.verdict)."""

    kind: str
    batch: str
    a_ms: np.ndarray
    b_ms: np.ndarray
    verdict: Verdict

    @property
    def shared(self) -> bool:
        return bool(self.a_ms.size and self.b_ms.size)


def group_diffs(a: Run, b: Run, times: tuple[list[StepTime], list[StepTime]] | None = None,
                ) -> list[GroupDiff]:
    """Every (kind, batch) group either side has, decode-only first, batches ascending."""
    ta, tb = times if times is not None else (step_times(a.records), step_times(b.records))
    labels = batch_labels([t.batch for t in (*ta, *tb)])
    keys = {(t.kind, labels[t.batch]) for t in (*ta, *tb)}
    out = []
    for kind, batch in sorted(keys, key=lambda k: (KINDS.index(k[0]), label_order(k[1]))):
        def pick(ts: list[StepTime], kind: str = kind, batch: str = batch) -> np.ndarray:
            return np.array([t.ms for t in ts if t.kind == kind and labels[t.batch] == batch])
        xa, xb = pick(ta), pick(tb)
        v = median_verdict(xa, xb, what=f"Median step time, {kind}, batch {batch}",
                           a_label=a.label, b_label=b.label)
        out.append(GroupDiff(kind, batch, xa, xb, v))
    return out


@dataclass(slots=True, frozen=True)
class Facet:
    """One thing two runs may not share: its name, each side's value ("" unknown)."""

    name: str
    a: str
    b: str

    @property
    def known(self) -> bool:
        return bool(self.a and self.b)

    @property
    def same(self) -> bool:
        return self.known and self.a == self.b


def modes_of(records: Sequence[StepRecord]) -> str:
    seen = dict.fromkeys(r.mode for r in records)
    return " + ".join(seen) if seen else ""


def graphs_of(records: Sequence[StepRecord]) -> str:
    """"on" when any step ran a CUDA graph, "off" when none did ("" with no steps)."""
    if not records:
        return ""
    return "on" if any(r.graph_bucket is not None for r in records) else "off"


def batch_sizes_of(records: Sequence[StepRecord]) -> str:
    return ", ".join(str(n) for n in sorted({r.num_requests for r in records}))


def facets(a: Run, b: Run) -> list[Facet]:
    """The two runs' facts side by side, in FACETS order: those the records tell (mode,
    graphs, batch sizes) and those the runs' facts carry (device, model, ...)."""
    def told(run: Run) -> dict[str, str]:
        return {**run.facts, "mode": modes_of(run.records),
                "CUDA graphs": graphs_of(run.records),
                "batch sizes": batch_sizes_of(run.records)}
    fa, fb = told(a), told(b)
    return [Facet(name, fa.get(name, ""), fb.get(name, "")) for name in FACETS]


def groups_text(groups: Sequence[GroupDiff]) -> str:
    """Groups as "decode-only 1, 9, with prefill 16" (kinds in KINDS order)."""
    parts = []
    for kind in KINDS:
        batches = sorted((g.batch for g in groups if g.kind == kind), key=label_order)
        if batches:
            parts.append(f"{kind} {', '.join(batches)}")
    return ", ".join(parts)


@dataclass(slots=True, frozen=True)
class Note:
    """One thing the diff cannot compare, in words (markdown). ``serious``: the runs' step
    times are not comparable at all (another device or model), not one setting apart."""

    serious: bool
    text: str


def comparability_notes(found: Sequence[Facet], groups: Sequence[GroupDiff]) -> list[Note]:
    """What the diff cannot compare, most serious first; [] when the runs share device,
    model, workload, settings and their groups."""
    notes: list[Note] = []
    apart = [f for f in found if f.name in NOT_COMPARABLE and f.known and not f.same]
    if apart:
        what = "; ".join(f"{f.name}: {f.a} vs {f.b}" for f in apart)
        notes.append(Note(True, f"**Not comparable: {what}.** Each run's step times are its "
                          "own machine's and model's: compare the shapes (which kind of step, "
                          "which part of the waterfall grows), not the values."))
    unknown = [f.name for f in found if f.name in NOT_COMPARABLE and not f.known]
    if unknown:
        notes.append(Note(False, f"Unknown for one run or both: {', '.join(unknown)} (a "
                          "recording without a meta line does not say)."))
    settings = [f for f in found if f.name in SETTINGS and f.known and not f.same]
    if settings:
        what = "; ".join(f"{f.name}: {f.a} vs {f.b}" for f in settings)
        notes.append(Note(False, f"Differs: {what}. The figures below show "
                          + ("its effect." if len(settings) == 1
                             else "their effects together.")))
    context = [f for f in found if f.name in CONTEXT and f.known and not f.same]
    if context:
        what = "; ".join(f"{f.name}: {f.a} vs {f.b}" for f in context)
        notes.append(Note(False, f"Also differs: {what}."))
    one_run = [f"{side} only: {kinds}" for side, kinds in (
        ("A", groups_text([g for g in groups if g.a_ms.size and not g.b_ms.size])),
        ("B", groups_text([g for g in groups if g.b_ms.size and not g.a_ms.size]))) if kinds]
    if one_run:
        notes.append(Note(False, f"Seen by one run only ({'; '.join(one_run)}): "
                          "those groups have nothing to be compared with."))
    return notes


@dataclass(slots=True)
class WaterfallPerStep:
    """A run's waterfall (telemetry.waterfall) over its window, per step: ms by part.
    ``split`` says whether kernel samples split the step busy into floor, kernels and gaps
    (else it is one part, UNSPLIT)."""

    parts_ms: dict[str, float]
    window_ms: float
    steps: int
    split: bool

    @property
    def step_ms(self) -> float:
        return self.window_ms / self.steps if self.steps else float("nan")


def waterfall_per_step(records: Sequence[StepRecord]) -> WaterfallPerStep | None:
    """The waterfall from the window's first compute start to its last compute end, divided
    by its steps; None without a compute span."""
    comp = [s for r in records for s in r.spans if s.lane == "compute"]
    if not comp:
        return None
    lo, hi = min(s.start_ns for s in comp), max(s.end_ns for s in comp)
    if hi <= lo:
        return None
    wf = waterfall(records, lo, hi)
    n = sum(1 for r in records if any(s.lane == "compute" for s in r.spans))
    split = wf.kernel_ns is not None
    parts: dict[str, float] = {}
    for key in COMPONENTS:
        v = wf.parts_ns.get(key)
        if v is None:
            if key == "floor":  # the unsplit busy stands where the split parts would
                parts[UNSPLIT] = wf.step_busy_ns / n / 1e6
            continue
        parts[key] = v / n / 1e6
    return WaterfallPerStep(parts, (hi - lo) / 1e6, n, split)


@dataclass(slots=True)
class FamilyTime:
    """Kernel time per sampled step by family (us), and how many steps were sampled."""

    us_per_step: dict[str, float]
    sampled_steps: int


def family_time(records: Sequence[StepRecord]) -> FamilyTime | None:
    """Kernel time per sampled step by family (FAMILIES order, the marker left out) from the
    kernel samples the records carry, over the sampled steps that are the run's own (a
    sample rides on a later step's record, which may open the next window); None when there
    is none (a CPU run, or a recording made without the kernel sampler)."""
    mine = {r.step for r in records}
    samples = [KernelSample([st for st in s.steps if st.step in mine and st.work], s.window,
                            s.kernel_ns) for r in records for s in r.kernel_samples]
    steps = sum(len(s.steps) for s in samples)
    if not steps:
        return None
    ns = family_time_ns(samples)
    us = {f: ns[f] / steps / 1e3 for f in FAMILIES if f != "marker" and ns.get(f)}
    return FamilyTime(us, steps)


@dataclass(slots=True)
class RunDiff:
    a: Run
    b: Run
    decode: DecodeVerdict
    groups: list[GroupDiff]
    facets: list[Facet]
    notes: list[Note]
    waterfalls: tuple[WaterfallPerStep | None, WaterfallPerStep | None]
    families: tuple[FamilyTime | None, FamilyTime | None]


def diff_runs(a: Run, b: Run) -> RunDiff:
    """Everything the Diff page shows of A against B. ValueError when a run has no steps."""
    for run in (a, b):
        if not any(r.spans for r in run.records):
            raise ValueError(f"run {run.label!r} has no steps with spans (telemetry off?)")
    groups = group_diffs(a, b)
    found = facets(a, b)
    return RunDiff(
        a, b,
        decode=decode_verdict([a.records], [b.records], a_label=a.label, b_label=b.label),
        groups=groups, facets=found, notes=comparability_notes(found, groups),
        waterfalls=(waterfall_per_step(a.records), waterfall_per_step(b.records)),
        families=(family_time(a.records), family_time(b.records)))
