"""Graph-mode timing under the profiler (issue 20): which hypothesis explains the gaps.

On the H200 (2026-12-04, 38ee40e) a tiny model's graph step measured 245 us from our
in-graph first event to the last while torch.profiler's kernels of that step spanned 82 us,
and sync + graphs kernel busy from torch.profiler (42.9%) sat 36 pp under the sampler's. The
hypotheses this experiment tells apart:

- H1 *CUPTI stretches graphs*: with kernel tracing on, a graph's kernels run with launch gaps
  (nodes launched or serialised one by one), so the kernels' span grows under the profiler;
  then our events are right and the profiler's figure is the perturbed one.
- H2 *the first in-graph event fires early under the profiler*: the marker kernel and the
  event after it run as soon as the graph starts, the body later; our span then holds a gap
  the kernels do not (first-event -> first body kernel large only under the profiler).
- H3 *idle-stream launch*: on an idle stream (sync mode) a graph's first kernels start while
  its later ones are still being submitted; queued behind work (async) it runs back to back.

Part A is synthetic (no engine): a captured graph of a marker, events at its first kernel,
after the body's first kernel and after its last, and ``--body`` small elementwise kernels;
replayed on an idle stream and queued behind a ~100 us spin kernel, with the profiler off
and on. Without the profiler the events give first->mid and first->last; with it the trace
also gives the marker's end, the body's first start and last end, and the gaps between
body kernels. Part B runs the engine (each of ``--presets``) in sync and async + graphs with the
sampler at ``--sample-period``: our compute span of sampled (profiler on) against unsampled
steps, the sampled steps' kernel span, and step periods sampled against unsampled.

    python -m bench truth_graphs                       # an H200, ~30 s
    python -m bench truth_graphs --device cpu          # CPU: says there is nothing to do
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.harness import report
from bench.harness.trace import profiler_trace
from bench.harness.workload import default_device

DESCRIPTION = "graph-mode timing under torch.profiler: which of three hypotheses holds"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--body", type=int, default=40, help="body kernels in the graph")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--presets", default="tiny:8,llama-8b:32",
                        help="comma-separated PRESET:BATCH of part B ('' to skip)")
    parser.add_argument("--sample-period", type=float, default=0.05)
    parser.add_argument("--window-s", type=float, default=1.0)


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _trace(prof: Any) -> list[dict[str, Any]]:
    return profiler_trace(prof)["traceEvents"]


def _corr(e: dict[str, Any]) -> Any:
    a = e.get("args") or {}
    return a.get("correlation", a.get("correlation id"))


# ------------------------------------------------------------------------------- part A
def synthetic(args: argparse.Namespace) -> dict[str, Any]:
    x = torch.ones(1 << 16, device="cuda")
    marker = torch.zeros(1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    ev = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(3)]

    def body() -> None:
        for _ in range(args.body):
            x.mul_(1.0001)

    with torch.cuda.stream(stream):
        body()
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        marker.bitwise_not_()
        ev[0].record()
        x.mul_(1.0001)
        ev[1].record()
        body()
        ev[2].record()
    stream.synchronize()
    pre = torch.cuda.Event(enable_timing=True)
    out: dict[str, Any] = {}
    acts = torch.profiler.ProfilerActivity
    for prof in ("plain", "profiler", "profiler+cpu"):
        for queued in (False, True):
            rows: list[dict[str, float]] = []
            ctx = (None if prof == "plain" else torch.profiler.profile(
                activities=[acts.CUDA] + ([acts.CPU] if prof.endswith("cpu") else [])))
            if ctx is not None:
                ctx.__enter__()
            try:
                for _ in range(args.replays):
                    with torch.cuda.stream(stream):
                        if queued:
                            torch.cuda._sleep(200_000)  # ~100 us: the graph queues behind it
                        pre.record(stream)
                        g.replay()
                    stream.synchronize()
                    rows.append({"pre_first": pre.elapsed_time(ev[0]) * 1e3,
                                 "first_mid": ev[0].elapsed_time(ev[1]) * 1e3,
                                 "first_last": ev[0].elapsed_time(ev[2]) * 1e3})
            finally:
                if ctx is not None:
                    ctx.__exit__(None, None, None)
            key = f"{prof}-{'queued' if queued else 'idle'}"
            res = {k: med([r[k] for r in rows]) for k in rows[0]}
            if ctx is not None:
                res.update(trace_figures(_trace(ctx)))
            out[key] = res
            print(f"A {key}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()
                                          if isinstance(v, float)), flush=True)
    return out


def trace_figures(events: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per graph launch: marker end -> body's first kernel, the body's span, its kernels'
    summed time and largest gap (medians over launches), in us."""
    launches = {_corr(e) for e in events if e.get("ph") == "X" and "GraphLaunch" in str(
        e.get("name", ""))}
    per: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and _corr(e) in launches:
            per.setdefault(_corr(e), []).append(e)
    gap_m, span, busy, maxgap = [], [], [], []
    for ks in per.values():
        ks.sort(key=lambda e: float(e["ts"]))
        mk = [e for e in ks if "bitwise_not" in e["name"]]
        work = [e for e in ks if "bitwise_not" not in e["name"]]
        if not work:
            continue
        s0 = float(work[0]["ts"])
        s1 = max(float(e["ts"]) + float(e["dur"]) for e in work)
        span.append(s1 - s0)
        busy.append(sum(float(e["dur"]) for e in work))
        gaps = [float(b["ts"]) - float(a["ts"]) - float(a["dur"])
                for a, b in zip(work, work[1:], strict=False)]
        maxgap.append(max(gaps, default=0.0))
        if mk:
            gap_m.append(s0 - float(mk[0]["ts"]) - float(mk[0]["dur"]))
    return {"launches": float(len(per)), "marker_end_to_body": med(gap_m),
            "kernel_span": med(span), "kernel_sum": med(busy), "max_gap": med(maxgap)}


# ------------------------------------------------------------------------------- part B
def engine_part(args: argparse.Namespace, item: str) -> dict[str, Any]:
    from bench.harness.shapes import build_model
    from bench.harness.workload import random_prompts
    from bench.suites.truth_engine import make_engine, params, wait_decoding
    from telemetry.collect import StepCollector

    preset, batch_s = item.split(":")
    batch = int(batch_s)
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build_model(preset, torch.device(args.device), dtype)
    prompts = random_prompts(batch, 64, model.config.vocab_size)
    ns = argparse.Namespace(device=args.device, dtype=str(dtype).split(".")[1], prompt=64,
                            budget=2048)
    act = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    eng = make_engine(model, ns, batch, 4000, name=preset)
    out: dict[str, Any] = {}
    try:
        eng.generate(prompts[:2], params(8))
        sampler = eng.loop.pipeline.kernels
        for mode in ("sync", "async"):
            eng.configure(async_batching=mode == "async", cuda_graphs=cuda)
            sampler.set_period(0)
            handles = [eng.submit(p, params(3900)) for p in prompts]
            wait_decoding(eng, batch)
            with StepCollector(eng.bus) as plain:
                time.sleep(args.window_s / 2)
            with StepCollector(eng.bus) as profiled:
                with torch.profiler.profile(activities=[act]):
                    time.sleep(args.window_s / 2)
            with StepCollector(eng.bus) as col:
                sampler.set_period(args.sample_period)
                sampler.next_at = 0.0
                time.sleep(args.window_s)
                sampler.set_period(0)
                time.sleep(0.4)
            for h in handles:
                eng.abort(h.request_id)
            for h in handles:
                h.result(timeout=120)
            out[f"{mode}-graphs"] = step_figures(plain.records, profiled.records, col.records)
            out[f"{mode}-graphs"]["convert_ms"] = [round(x * 1e3, 2) for x in sampler.convert_s]
            print(f"B {preset} {mode}-graphs: {json.dumps(out[f'{mode}-graphs'])}", flush=True)
    finally:
        eng.shutdown()
    return out


def _comp(r: Any) -> Any:
    c = [s for s in r.spans if s.lane == "compute"]
    return c[0] if c else None


def step_figures(plain: list, profiled: list, sampled_run: list) -> dict[str, Any]:
    samples = [s for r in sampled_run for s in r.kernel_samples]
    in_sample = {st.step: st for s in samples for st in s.steps}
    recs = [r for r in sampled_run if r.num_tokens and _comp(r) is not None]
    starts = {r.step: _comp(r).start_ns for r in recs}

    def period(r: Any) -> float | None:
        nxt = starts.get(r.step + 1)
        return (nxt - starts[r.step]) / 1e3 if nxt is not None else None

    def durs(rs: list) -> list[float]:
        return [_comp(r).duration_ns / 1e3 for r in rs if r.num_tokens and _comp(r)]

    def periods(rs: list) -> list[float]:
        st = sorted((r.step, _comp(r).start_ns) for r in rs if r.num_tokens and _comp(r))
        return [(b - a) / 1e3 for (n, a), (m, b) in zip(st, st[1:], strict=False) if m == n + 1]

    prof_periods = periods(profiled)  # early vs late in one profiler session: does it age?
    smp = [r for r in recs if r.step in in_sample]
    uns = [r for r in recs if r.step not in in_sample]
    kspan, excess = [], []
    for r in smp:
        work = in_sample[r.step].work
        if work:
            ks = (max(k.end_ns for k in work) - min(k.start_ns for k in work)) / 1e3
            kspan.append(ks)
            excess.append(_comp(r).duration_ns / 1e3 - ks)
    return {
        "span_us_plain": med(durs(plain)), "span_us_under_profiler": med(durs(profiled)),
        "span_us_sampled": med(durs(smp)), "span_us_unsampled": med(durs(uns)),
        "kernel_span_us_sampled": med(kspan), "span_minus_kernels_us": med(excess),
        "period_us_sampled": med([p for r in smp if (p := period(r)) is not None]),
        "period_us_unsampled": med([p for r in uns if (p := period(r)) is not None]),
        "period_us_plain": med(periods(plain)),
        "period_us_profiled_first10": med(prof_periods[:10]),
        "period_us_profiled_last10": med(prof_periods[-10:]),
        "samples": len(samples), "sampled_steps": len(smp), "steps": len(recs)}


def run(args: argparse.Namespace, out: Path) -> dict:
    if args.device != "cuda" or not torch.cuda.is_available():
        # A dry run of part B's plumbing (eager, no kernels): nothing of graphs to measure.
        print("truth_graphs: no CUDA device: part A skipped, part B dry (eager, tiny)")
        args.device, args.window_s = "cpu", min(args.window_s, 0.4)
        return {"device": "cpu", "engine": {"tiny:2": engine_part(args, "tiny:2")}}
    with torch.profiler.profile():  # Kineto's client on this thread (see truth.run)
        pass
    summary: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "synthetic": synthetic(args)}
    if args.presets:
        from engine.instruments import kernel_trace

        summary["engine"] = {}
        for item in args.presets.split(","):
            summary["engine"][item] = engine_part(args, item)
            torch.cuda.empty_cache()
        summary["read_objects"] = kernel_trace.READ_OBJECTS  # None: no sample; False: JSON
        print(f"trace read from the profiler's objects: {summary['read_objects']}")
    report.write_json(out / "truth_graphs.json", summary)
    return summary
