"""Stalls: steps much slower than recent steps of their kind, each named with its cause.

Owns the rule that flags a stall and the attribution of its cause, from a step's record and
the facts the engine saw over that step's interval (`StepFacts`): timestamped marks (a GC
pause, a CUDA graph capture, a sentinel check, an engine command), the step threads' CPU time
and run-queue wait, the step's prefill and recompute tokens. A flagged record carries the
verdict in its ``stall*`` fields (telemetry/records.py); docs/stalls.md says what each cause
means and how it is known.

A step's interval is what its requests' inter-token latency sees: from the end of the step
before it to its own end (from its own first span when the step before it left nothing to
run, so an idle engine is no stall). Its kind is (mode, CUDA graph or not, decode-only or
with prefill, batch size as a power-of-two bucket); where a kind has too few recent steps, the
same kind over every batch size, then every step with or without prefill, stands in.

Pure and single-threaded: no clock reads, no threads, no engine. It must never import engine/
or ui/ code; the engine calls it once per step on its loop thread, so each call stays cheap
(a comparison with a cached median; the full attribution only for a flagged step).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from telemetry.records import CPU_LANES, DEVICE_LANES, StepRecord

GC = "gc"
GRAPH_CAPTURE = "graph_capture"
PREFILL_CHUNK = "prefill_chunk"
HOST_WAIT = "host_wait"
PREEMPTION = "preemption"
SENTINEL_CHECK = "sentinel_check"
ENGINE_COMMAND = "engine_command"
CPU_DESCHEDULED = "cpu_descheduled"
UNEXPLAINED = "unexplained"
# Every cause a stall may carry: the label values of gapless:stalls_total{cause}.
STALL_CAUSE_NAMES: tuple[str, ...] = (GC, GRAPH_CAPTURE, PREFILL_CHUNK, HOST_WAIT, PREEMPTION,
                                 SENTINEL_CHECK, ENGINE_COMMAND, CPU_DESCHEDULED, UNEXPLAINED)
# Causes known by timestamps (a Mark); the rest come from the record and the thread's times.
MARK_CAUSE_NAMES: tuple[str, ...] = (GC, GRAPH_CAPTURE, SENTINEL_CHECK, ENGINE_COMMAND)
# Time in a step's interval on none of its CPU lanes (commands, instruments, GC, a sleep
# between phases): the "lane" an unexplained stall names when that time grew.
BETWEEN_PHASES = "between phases"

# The rule (docs/stalls.md): a step is a stall when its interval is at least RATIO times the
# median interval of the last WINDOW_STEPS steps of its kind, at least MADS robust standard
# deviations (1.4826 x the median absolute deviation) above that median, and at least
# MIN_EXCESS_NS above it; a kind needs MIN_STEPS recent steps before it judges anything.
WINDOW_STEPS = 64
MIN_STEPS = 8
RATIO = 3.0
MADS = 4.0
MIN_EXCESS_NS = 1_000_000
# A fact names the cause when it accounts for at least this share of the excess (the
# interval minus the median); a prefill is unusual at UNUSUAL_PREFILL times its kind's median.
EXPLAINS = 0.5
UNUSUAL_PREFILL = 2.0
_MEDIAN_EVERY = 16  # appends between refreshes of a kind's cached median


@dataclass(slots=True)
class Mark:
    """Something the engine did over [start_ns, end_ns] (host clock) that can stall a step:
    ``cause`` is one of MARK_CAUSE_NAMES, ``label`` says what it was ("gen 2 GC", "num_slots=3")."""

    cause: str
    start_ns: int
    end_ns: int
    label: str = ""


@dataclass(slots=True)
class StepFacts:
    """What the engine saw over one step's interval besides the step's record.

    ``marks``: the marks that may overlap it. ``cpu_ns`` / ``runqueue_ns``: the step
    thread's CPU time and its time runnable but waiting for a CPU, since the previous step's
    facts (None where the platform does not say). ``next_record``: the step launched after it,
    whose CPU phases ran inside its interval (async mode), or None. ``worker_cpu_ns`` /
    ``worker_runqueue_ns``: the same two of the threads that run compute on the host
    (host-emulated streams; None on a GPU).
    """

    marks: list[Mark] = field(default_factory=list)
    cpu_ns: int | None = None
    runqueue_ns: int | None = None
    next_record: StepRecord | None = None
    worker_cpu_ns: int | None = None
    worker_runqueue_ns: int | None = None


@dataclass(slots=True)
class _Seen:
    """One judged step, kept for its kind's baseline."""

    interval_ns: int
    start_ns: int
    end_ns: int
    cpu_ns: int | None  # the step threads' CPU time: the loop's and the host compute's
    runqueue_ns: int | None  # the step threads' run-queue wait
    blocked_ns: int | None  # off-CPU, not runnable, outside its wait for the device
    record: StepRecord
    next_record: StepRecord | None
    lanes: dict[str, int] | None = None  # lane_times(), once asked for


class _Kind:
    """The recent steps of one kind and a cached median of their intervals."""

    __slots__ = ("seen", "median_ns", "_stale")

    def __init__(self) -> None:
        self.seen: deque[_Seen] = deque(maxlen=WINDOW_STEPS)
        self.median_ns = 0
        self._stale = 0

    def add(self, s: _Seen) -> None:
        self.seen.append(s)
        self._stale += 1
        if self._stale >= _MEDIAN_EVERY or len(self.seen) <= MIN_STEPS:
            self.refresh()

    def refresh(self) -> None:
        self._stale = 0
        self.median_ns = _median([s.interval_ns for s in self.seen])


def kind_of(rec: StepRecord) -> tuple[str, bool, bool, int]:
    """A step's kind: mode, CUDA graph or not, with prefill or not, batch-size bucket."""
    return (rec.mode, rec.graph_bucket is not None, rec.prefill_tokens > 0,
            rec.num_requests.bit_length())


class StallDetector:
    """Judges each step as it is published, in step order; see the module docstring."""

    def __init__(self) -> None:
        self._kinds: dict[tuple, _Kind] = {}
        self._prev_end: int | None = None
        self._prev_had_work = False
        self.stalls = 0
        self.longest_ns = 0
        self.last_end_ns = 0  # the end of the latest step judged

    def observe(self, rec: StepRecord, facts: StepFacts) -> bool:
        """Judge ``rec``: when it is a stall, set its ``stall*`` fields and return True.
        Records without spans (telemetry off) are skipped."""
        spans = rec.spans
        if not spans:
            return False
        first = end = spans[0].start_ns
        wait = None
        for s in spans:
            if s.start_ns < first:
                first = s.start_ns
            if s.end_ns > end:
                end = s.end_ns
            if s.lane == "cpu.wait":
                wait = s
        prev_end = self._prev_end
        start = prev_end if prev_end is not None and self._prev_had_work and prev_end < end \
            else first
        if prev_end is None or end > prev_end:
            self._prev_end = end
        self._prev_had_work = rec.running + rec.waiting > 0
        self.last_end_ns = end
        interval = end - start
        blocked = None
        if facts.cpu_ns is not None and facts.runqueue_ns is not None:
            device_wait = 0 if wait is None else max(0, min(wait.end_ns, end)
                                                     - max(wait.start_ns, start))
            blocked = max(0, interval - facts.cpu_ns - facts.runqueue_ns - device_wait)
        cpu, runqueue = facts.cpu_ns, facts.runqueue_ns
        if cpu is not None and runqueue is not None and facts.worker_runqueue_ns is not None:
            cpu += facts.worker_cpu_ns or 0
            runqueue += facts.worker_runqueue_ns
        seen = _Seen(interval, start, end, cpu, runqueue, blocked, rec, facts.next_record)
        key = kind_of(rec)
        keys = (key, key[:3], key[2:3])
        kinds = self._kinds
        baseline = None
        for k in keys:
            kind = kinds.get(k)
            if kind is None:
                kind = kinds[k] = _Kind()
            elif baseline is None and len(kind.seen) >= MIN_STEPS:
                baseline = kind
        flagged = False
        if baseline is not None and interval >= RATIO * baseline.median_ns \
                and interval - baseline.median_ns >= MIN_EXCESS_NS:
            flagged = self._judge(seen, list(baseline.seen), facts)
        for k in keys:
            kinds[k].add(seen)
        return flagged

    def _judge(self, seen: _Seen, history: list[_Seen], facts: StepFacts) -> bool:
        median = _median([s.interval_ns for s in history])
        mad = _median([abs(s.interval_ns - median) for s in history])
        excess = seen.interval_ns - median
        if (seen.interval_ns < RATIO * median or excess < MIN_EXCESS_NS
                or excess < MADS * 1.4826 * mad):
            return False
        cause, detail = name_cause(seen, history, facts, median, excess)
        rec = seen.record
        rec.stall, rec.stall_ns, rec.stall_baseline_ns = cause, seen.interval_ns, median
        rec.stall_detail = detail
        self.stalls += 1
        self.longest_ns = max(self.longest_ns, seen.interval_ns)
        return True


def name_cause(seen: _Seen, history: list[_Seen], facts: StepFacts, median: int,
               excess: int) -> tuple[str, str]:
    """The cause of a stall and what named it. First the mark that overlaps the interval
    most, when it accounts for at least EXPLAINS of the excess (the interval minus the kind's
    median): what a mark times may show as the thread facts below too (a sleep inside a
    command is blocked time). Then, of the facts below, the one that accounts for the most
    of the excess (at most all of it), again when that is at least EXPLAINS of it (ties go to
    the earlier one):
    - an unusual prefill (UNUSUAL_PREFILL times the kind's median prefill), by what the
      median interval grows to when scaled by the prefill's size; a preemption when most of
      it recomputes preempted requests;
    - the loop thread's blocked time beyond its kind's median (measured on that one thread);
    - the step threads' run-queue wait beyond what their CPU time usually waits (the kind's
      median wait per CPU-second; summed over threads).
    Else a preemption made while scheduling the step, if any; else unexplained. Each names
    the lane that grew most."""
    where = grown_lane(seen, history)
    marks = mark_overlaps(facts.marks, seen.start_ns, seen.end_ns)
    if marks:
        cause = max(marks, key=lambda c: marks[c][0])
        ns, label = marks[cause]
        if ns >= EXPLAINS * excess:
            return cause, f"{label} ({_ms(ns)}); {where}"
    found: list[tuple[int, int, str, str]] = []  # (ns explained, rank for ties, cause, what)
    rec = seen.record
    if rec.prefill_tokens:
        usual = max(1, _median([s.record.prefill_tokens for s in history]))
        if rec.prefill_tokens >= UNUSUAL_PREFILL * usual:
            ns = min(excess, int(median * (rec.prefill_tokens / usual - 1)))
            what = f"{rec.prefill_tokens} prefill tokens (usually {usual})"
            if 2 * rec.recomputed_tokens >= rec.prefill_tokens:
                found.append((ns, 3, PREEMPTION, f"{rec.recomputed_tokens} tokens recomputed "
                              f"after a preemption, {what}"))
            else:
                found.append((ns, 3, PREFILL_CHUNK, what))
    if seen.runqueue_ns is not None and seen.cpu_ns is not None:
        # A step with more work waits longer for a CPU on a busy host: only the wait beyond
        # its kind's usual wait per CPU-second of work names the cause.
        share = statistics.median([s.runqueue_ns / s.cpu_ns for s in history
                                   if s.runqueue_ns is not None and s.cpu_ns] or [0.0])
        grown = seen.runqueue_ns - int(share * seen.cpu_ns)
        found.append((grown, 1, CPU_DESCHEDULED, f"waited {_ms(grown)} more for a CPU than "
                      "its work usually does"))
    if seen.blocked_ns is not None:
        grown = seen.blocked_ns - _median([s.blocked_ns or 0 for s in history])
        found.append((grown, 2, HOST_WAIT, f"blocked {_ms(grown)} more off the device wait"))
    if found:
        # Each fact explains at most the whole excess (the run-queue waits of several threads
        # add up past the wall time): where two explain all of it, the step's own wins.
        ns, _, cause, what = max((min(ns, excess), rank, c, w) for ns, rank, c, w in found)
        if ns >= EXPLAINS * excess:
            return cause, f"{what}; {where}"
    if rec.preemptions or (seen.next_record is not None and seen.next_record.preemptions):
        return PREEMPTION, f"requests preempted while scheduling; {where}"
    return UNEXPLAINED, where


def mark_overlaps(marks: list[Mark], start: int, end: int) -> dict[str, tuple[int, str]]:
    """Per cause, the time its marks overlap [start, end] and the label of the longest one.
    Nested marks count once: a GC inside a command or a capture is the GC's, a capture inside
    a command is the capture's."""
    out: dict[str, list] = {}
    for m in marks:
        ns = min(m.end_ns, end) - max(m.start_ns, start)
        if ns <= 0:
            continue
        got = out.setdefault(m.cause, [0, "", 0])
        got[0] += ns
        if ns > got[2]:
            got[1], got[2] = m.label or m.cause, ns
    totals = {c: v[0] for c, v in out.items()}
    gc_ns = totals.get(GC, 0)
    for c in (GRAPH_CAPTURE, SENTINEL_CHECK, ENGINE_COMMAND):
        if c in out:
            out[c][0] = max(0, out[c][0] - gc_ns)
    if ENGINE_COMMAND in out:
        inner = totals.get(GRAPH_CAPTURE, 0) + totals.get(SENTINEL_CHECK, 0)
        out[ENGINE_COMMAND][0] = max(0, out[ENGINE_COMMAND][0] - inner)
    return {c: (v[0], v[1]) for c, v in out.items()}


def lane_times(seen: _Seen) -> dict[str, int]:
    """Time on each CPU lane and device lane inside the step's interval (its own spans and
    those of the step launched after it), and BETWEEN_PHASES: the rest of the interval off
    the CPU lanes. Kept on ``seen``: the next stall of its kind asks again."""
    if seen.lanes is not None:
        return seen.lanes
    out = seen.lanes = dict.fromkeys(CPU_LANES + DEVICE_LANES, 0)
    start, end = seen.start_ns, seen.end_ns
    for r in (seen.record, seen.next_record):
        if r is None:
            continue
        for s in r.spans:
            if s.lane in out:
                ns = min(s.end_ns, end) - max(s.start_ns, start)
                if ns > 0:
                    out[s.lane] += ns
    out[BETWEEN_PHASES] = max(0, seen.interval_ns - sum(out[lane] for lane in CPU_LANES))
    return out


def grown_lane(seen: _Seen, history: list[_Seen]) -> str:
    """The lane whose time in the interval grew most over its median among ``history`` (a
    CPU lane or BETWEEN_PHASES) and by how much, as "cpu.post +300.0 ms". When that is the
    CPU's wait for the device, the device lane that grew most follows in brackets
    ("cpu.wait +9.9 ms (compute +9.8 ms)"): what the CPU waited for."""
    mine = lane_times(seen)
    past = [lane_times(s) for s in history]

    def grown(lanes: tuple[str, ...]) -> tuple[str, int]:
        out = {lane: mine[lane] - _median([p[lane] for p in past]) for lane in lanes}
        best = max(out, key=out.__getitem__)
        return best, out[best]

    lane, ns = grown((*CPU_LANES, BETWEEN_PHASES))
    where = f"{lane} +{_ms(max(0, ns))}"
    if lane == "cpu.wait":
        device, device_ns = grown(DEVICE_LANES)
        if device_ns > 0:
            where += f" ({device} +{_ms(device_ns)})"
    return where


def _median(values: list[int]) -> int:
    if not values:
        return 0
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) // 2


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms"
