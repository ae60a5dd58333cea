"""Kernel busy, compared fairly: what each tracer measures without perturbing it.

Both tracers slow the steps they trace: with CUPTI on, every CUDA API call costs more and a
graph launch is traced node by node, so a CPU-bound step runs longer (a sampled step's period
is longer than the others', and the profiler's window runs at about the sampled steps'
period). Busy = kernel time / period, so both busy figures are the perturbed steps', each
perturbed its own way, and a close match between them says little where the CPU sets the
period. What neither tracer perturbs is the kernel time of a step (graph kernels run back to
back whatever the CPU does; an eager kernel's duration does not change with the launch cost
before it), the same in every sample of a run. So, per mode:

- the *bare* step period: our own step records over a window with no profiler at all;
- kernel time per step from the reference (torch.profiler's kernels put on our clock through
  the Unix-time/perf-counter offset and joined to our steps' compute spans) and from the
  sampler's sampled steps, compared on the same steps (the contexts both traced: a step's
  kernel time grows with its context; the reference and sampled windows run as many steps
  of a fresh batch as the bare window did): the two must agree;
- busy against the bare period from each (kernel time per step / bare period): the busy of
  unperturbed steps, as each tracer measures it, with the same denominator;
- the dashboard's figure: the waterfall's kernel part (each unsampled step given the kernel
  time per step of sampled steps of its key at its context, telemetry.waterfall) over the
  bare window, against the truth: the reference's kernel time at each bare step's context
  over the same window.

Pure functions of records and intervals, except `clock_offset_ns`, which reads two clocks.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections.abc import Sequence
from typing import Any

from telemetry.kernel_family import MARKER_PATTERN
from telemetry.metrics import union_length
from telemetry.waterfall import at_context, context_of


def clock_offset_ns(pairs: int = 9) -> int:
    """Unix ns (Kineto's trace clock) minus time.perf_counter_ns (ours), from the tightest of
    ``pairs`` readings (error well under a microsecond)."""
    best: tuple[int, int] | None = None
    for _ in range(pairs):
        a = time.perf_counter_ns()
        u = time.time_ns()
        b = time.perf_counter_ns()
        if best is None or b - a < best[0]:
            best = (b - a, u - (a + b) // 2)
    assert best is not None
    return best[1]


def trace_intervals(trace: dict[str, Any], offset_ns: int, device_cats: Sequence[str],
                    host_copy: Any, marker: bool = False) -> list[tuple[int, int]]:
    """Device work of a Kineto JSON trace on our clock: (start, end) ns, host copies left out,
    and the graph start marker unless ``marker``. ``offset_ns``: clock_offset_ns() read
    around the window."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in device_cats:
            continue
        name = str(e.get("name", ""))
        if host_copy.search(name) or (not marker and MARKER_PATTERN.search(name)):
            continue
        a = base + round(float(e["ts"]) * 1000) - offset_ns
        out.append((a, a + round(float(e.get("dur", 0)) * 1000)))
    out.sort()
    return out


def compute_spans(records: Sequence[Any], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(step, start, end) of each step's compute span inside [lo, hi], in start order."""
    out = []
    for r in records:
        for s in r.spans:
            if s.lane == "compute" and lo <= s.start_ns and s.end_ns <= hi:
                out.append((r.step, s.start_ns, s.end_ns))
                break
    return sorted(out, key=lambda x: x[1])


def period_us(spans: Sequence[tuple[int, int, int]]) -> float | None:
    """Median compute-start to compute-start of consecutive steps, us."""
    d = [b[1] - a[1] for a, b in zip(spans, spans[1:], strict=False) if b[0] == a[0] + 1]
    return statistics.median(d) / 1e3 if d else None


def kernel_per_step(spans: Sequence[tuple[int, int, int]],
                    intervals: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """Kernel time (union, us) of each step: the intervals whose midpoint lies in its compute
    span. Median over steps; ``joined`` is the share of the kernel time between the first
    span's start and the last one's end that some step took (1.0 = none fell between)."""
    if not spans or not intervals:
        return {"median_us": None, "steps": 0, "joined": None, "by_step": {}}
    mids = [(a + b) // 2 for a, b in intervals]
    per, taken, by_step = [], 0, {}
    for n, s0, s1 in spans:
        i, j = bisect.bisect_left(mids, s0), bisect.bisect_right(mids, s1)
        k = union_length(intervals[i:j])
        if k:
            per.append(k)
            by_step[n] = k
        taken += k
    lo, hi = spans[0][1], spans[-1][2]
    i, j = bisect.bisect_left(mids, lo), bisect.bisect_right(mids, hi)
    total = union_length(intervals[i:j])
    return {"median_us": statistics.median(per) / 1e3 if per else None, "steps": len(per),
            "joined": taken / total if total else None, "by_step": by_step}


def by_context(records: Sequence[Any], per_step: dict[int, int]) -> dict[int, int]:
    """Kernel ns per step keyed by the step's total context (telemetry.waterfall.context_of;
    several steps of one context: their mean). Every window decodes a fresh batch from the
    same prompts, so a context names the same step of each window."""
    ctx = {r.step: context_of(r) for r in records if r.step in per_step}
    pooled: dict[int, list[int]] = {}
    for n, k in per_step.items():
        if ctx.get(n):
            pooled.setdefault(ctx[n], []).append(k)
    return {c: round(sum(v) / len(v)) for c, v in pooled.items()}


def sampled_by_step(samples: Sequence[Any]) -> dict[int, int]:
    """Each sampled step's kernel time (union, marker left out), ns."""
    return {st.step: union_length((k.start_ns, k.end_ns) for k in st.work)
            for s in samples for st in s.steps if st.work}


def matched_kernel(ref: dict[int, int], ours: dict[int, int]) -> dict[str, Any]:
    """Kernel time per step from both tracers on the same steps (contexts both traced), us:
    the comparison of what each counts. Kernel time grows with context, and the sampler's
    steps and the reference's lie at different contexts (the sampled window runs fewer,
    slower steps; the reference starts after a discarded warm-up window), so medians over
    each tracer's own steps differ, most in graph mode: only the same steps compare."""
    both = sorted(set(ref) & set(ours))
    if not both:
        return {"kernel_ref_us": None, "kernel_ours_us": None, "matched_steps": 0}
    return {"kernel_ref_us": sum(ref[c] for c in both) / len(both) / 1e3,
            "kernel_ours_us": sum(ours[c] for c in both) / len(both) / 1e3,
            "matched_steps": len(both)}


def truth_busy(records: Sequence[Any], ref: dict[int, int], lo: int, hi: int) -> float | None:
    """Kernel busy of [lo, hi) as the reference measured kernels: each step's compute span
    in it given the reference's kernel time at its context (the nearest traced one's outside
    their range; at most the span), over the window: what the dashboard's figure
    (telemetry.waterfall on the same steps, from sampled steps) must match."""
    points = sorted(ref.items())
    if not points or hi <= lo:
        return None
    k = 0.0
    for r in records:
        for s in r.spans:
            if s.lane != "compute" or s.end_ns <= s.start_ns:
                continue
            inside, full = min(s.end_ns, hi) - max(s.start_ns, lo), s.end_ns - s.start_ns
            if inside > 0:
                at = at_context(points, context_of(r))
                k += min(at or 0.0, full) * inside / full
    return k / (hi - lo)


def step_differences(records: Sequence[Any], ref: dict[int, int], samples: Sequence[Any],
                     lo: int, hi: int, worst: int = 6) -> dict[str, Any]:
    """Per step of [lo, hi): the kernel time the dashboard gives it (telemetry.waterfall's
    KernelTimes from the samples) against the truth's (the reference's at its context), both
    capped at the step's compute span as both figures are, us; the steps that differ most,
    and how many were capped. Says which steps a dashboard-vs-truth difference comes from."""
    from telemetry.waterfall import kernel_times

    times, points, rows = kernel_times(records, samples), sorted(ref.items()), []
    for r in records:
        for s in r.spans:
            if s.lane != "compute" or s.end_ns <= s.start_ns or not lo <= s.start_ns < hi:
                continue
            full = s.end_ns - s.start_ns
            dash, at = times.of(r, full), at_context(points, context_of(r))
            rows.append({"step": r.step, "context": context_of(r), "span_us": full / 1e3,
                         "dash_us": None if dash is None else dash / 1e3,
                         "truth_us": None if at is None else min(at, full) / 1e3,
                         "truth_uncapped_us": None if at is None else at / 1e3,
                         "exact_context": context_of(r) in ref})
    both = [x for x in rows if x["dash_us"] is not None and x["truth_us"] is not None]
    both.sort(key=lambda x: -abs(x["dash_us"] - x["truth_us"]))
    return {"steps": len(rows), "capped": sum(1 for x in both if x["truth_us"] <
                                              x["truth_uncapped_us"]),
            "exact_context": sum(1 for x in rows if x["exact_context"]),
            "dash_minus_truth_us_total": sum(x["dash_us"] - x["truth_us"] for x in both),
            "worst": [{k: round(v, 1) if isinstance(v, float) else v for k, v in x.items()}
                      for x in both[:worst]]}


def sampled_kernel_per_step(samples: Sequence[Any]) -> float | None:
    """Median over sampled steps of their kernels' union (marker left out), us."""
    per = [union_length((k.start_ns, k.end_ns) for k in st.work) for s in samples for st in s.steps
           if st.work]
    return statistics.median(per) / 1e3 if per else None


def fair_busy(bare_period_us: float | None, ref_k_us: float | None,
              ours_k_us: float | None) -> dict[str, Any]:
    """Busy of unperturbed steps from each tracer's kernel time per step over the bare
    period, and how far apart (pp)."""
    def over(k: float | None) -> float | None:
        return k / bare_period_us if k is not None and bare_period_us else None

    ref, ours = over(ref_k_us), over(ours_k_us)
    return {"ref_vs_bare": ref, "ours_vs_bare": ours,
            "diff_vs_bare_pp": 100 * (ours - ref) if ref is not None and ours is not None
            else None,
            "kernel_diff_pct": 100 * (ours_k_us / ref_k_us - 1) if ref_k_us and ours_k_us
            else None}


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min, max and the per-repeat values (None dropped) of a figure over repeats."""
    v = [x for x in values if x is not None]
    return {"median": statistics.median(v) if v else None, "min": min(v) if v else None,
            "max": max(v) if v else None, "n": len(v)}


def run_until(window_s: float, until: Any = None, max_s: float | None = None) -> None:
    """Sleep ``window_s``, or with ``until`` until it returns True (at most ``max_s``)."""
    if until is None:
        time.sleep(window_s)
        return
    deadline = time.monotonic() + (max_s if max_s is not None else 4 * window_s)
    while not until() and time.monotonic() < deadline:
        time.sleep(0.002)


def reference_busy(window_s: float, cuda: bool, until: Any = None, max_s: float | None = None,
                   on_loop: Any = None) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """torch.profiler (CUDA activities) over ``window_s`` (or until ``until()``, see
    run_until) of whatever the engine runs: its kernel busy (union of device work, host
    copies out, over first kernel to last) and the device work's intervals on our clock
    (for kernel time per step). With ``on_loop`` (Engine.run_on_loop) the session starts and
    stops on the engine's loop thread between its steps, never while that thread launches
    (bench/harness/truth_kick.py: what a stop from this thread did to later sessions)."""
    if not cuda:
        run_until(window_s, until, max_s)
        return {"busy": None}, []
    from torch.profiler import ProfilerActivity, profile

    from bench.harness.trace import profiler_trace
    from engine.instruments.kernel_sampler import HOST_COPY, lost_launches
    from engine.instruments.profiler_sessions import clock_lost

    before = clock_offset_ns()
    prof = profile(activities=[ProfilerActivity.CUDA])
    call = on_loop if on_loop is not None else (lambda fn: fn())
    call(prof.start)
    try:
        run_until(window_s, until, max_s)
    finally:
        call(prof.stop)
    trace = profiler_trace(prof)  # at once: the next session would zero its times
    offset = (before + clock_offset_ns()) // 2
    events = trace["traceEvents"]
    cats = ("kernel", "gpu_memset", "gpu_memcpy")
    iv = trace_intervals(trace, offset, cats, HOST_COPY, marker=True)  # busy: as before
    # Kernel launches the trace holds no record of (the profiler can lose every kernel of an
    # eager window mid-run, and loses some at a session's start). A window that lost some
    # only starts later; one that lost all has no figure.
    lost = lost_launches(events)
    why_clock = clock_lost(events)
    if not iv or why_clock:
        cats: dict[str, int] = {}
        for e in events:
            cats[str(e.get("cat"))] = cats.get(str(e.get("cat")), 0) + 1
        return {"busy": None, "kernels": 0, "lost_launches": lost, "events_by_cat": cats,
                "why": why_clock or f"torch.profiler kept no kernel record of {lost} kernel "
                "launches in its window"}, []
    lo, hi = min(a for a, _ in iv), max(b for _, b in iv)
    return {"busy": union_length(iv) / (hi - lo), "kernels": len(iv), "window_s": (hi - lo) / 1e9,
            "lost_launches": lost, "clock_offset_drift_us": (clock_offset_ns() - before) / 1e3
            }, trace_intervals(trace, offset, cats, HOST_COPY)  # per step: the marker out


def fair_markdown(shapes: dict[str, Any]) -> list[str]:
    """The table of what each tracer measures without perturbing it (see the docstring)."""
    lines = ["## Kernel busy of unperturbed steps (medians over repeats)", "",
             "Step period without a profiler (bare), under torch.profiler (ref) and of sampled "
             "steps; kernel time per step from each tracer on the same steps (contexts both "
             "traced; n: how many); busy = that kernel time / the bare period; the dashboard's "
             "figure is the waterfall's kernel part over the bare window (kernel time per step "
             "of sampled steps, by key and context, given to the unsampled steps), the truth "
             "the reference's kernel time at each bare step's context over the same window.",
             "", "| shape | mode | period bare / ref / sampled (us) | kernel/step ref / ours "
             "(us), n | diff | busy vs bare ref / ours | diff (pp), each repeat | dashboard / "
             "truth | diff (pp), each repeat |", "|---|---|---|---|---:|---|---|---|---|"]

    def f(x: Any, fmt: str = ".0f") -> str:
        return "n/a" if x is None else format(x, fmt)

    for preset, sh in shapes.items():
        for mode, r in sh["modes"].items():
            reps = r.get("repeats") or []

            def med(key: str, reps: list = reps) -> Any:
                return spread([x.get(key) for x in reps])["median"]

            lines.append(
                f"| {preset} b{sh['batch']} | {mode} | {f(med('period_bare_us'))} / "
                f"{f(med('period_ref_us'))} / {f(med('period_sampled_us'))} | "
                f"{f(med('kernel_ref_us'), '.1f')} / {f(med('kernel_ours_us'), '.1f')}, "
                f"{f(med('matched_steps'))} | "
                f"{f(med('kernel_diff_pct'), '+.2f')}% | "
                f"{f(_pct(med('ref_vs_bare')), '.1f')}% / {f(_pct(med('ours_vs_bare')), '.1f')}% | "
                f"{f(med('diff_vs_bare_pp'), '+.2f')}: "
                + " ".join(f(x.get("diff_vs_bare_pp"), "+.2f") for x in reps)
                + f" | {f(_pct(med('dashboard_bare')), '.1f')}% / "
                f"{f(_pct(med('truth_bare')), '.1f')}% | "
                f"{f(med('dashboard_vs_truth_pp'), '+.2f')}: "
                + " ".join(f(x.get("dashboard_vs_truth_pp"), "+.2f") for x in reps) + " |")
    return lines


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x
