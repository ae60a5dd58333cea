"""Sync vs async batching, CUDA graphs off/on, on a fixed-length workload, beside transformers'
own continuous batching (`generate_batch`) on the same prompts.

Default workload: a Llama-3.1-8B-shaped model with random bf16 weights, 32 requests x
(256 prompt + 1024 new tokens), greedy, no EOS. Per mode: wall time, tokens/s, GPU busy (union
of compute spans), idle gaps, and wall / floor. With --repeats N the modes run N times in
alternated order (A B, B A, ...) and the table gives the median and spread. Optional:
--telemetry-cost (the same run with telemetry off) and --profile (busy measured independently
by torch.profiler).

    python -m bench async-vs-sync --modes sync-graphs,async-graphs --repeats 3   # on a GPU
    python -m bench async-vs-sync --preset tiny --device cpu --new 32            # CPU smoke
    python -m bench async-vs-sync --model-impls transformers,gapless --modes async-graphs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench.harness import baselines, report, trace
from bench.harness.floor import ByteFloor
from bench.harness.fused_args import add_fused_arguments, fused_config
from bench.harness.timing import Samples
from bench.harness.workload import add_model_arguments, model_from_args, random_prompts
from telemetry.metrics import union_length

DESCRIPTION = ("what async batching and CUDA graphs save on a whole run, against transformers' "
               "generate_batch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--modes", default="sync-eager,async-eager,sync-graphs,async-graphs")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per mode, in alternated order (median and spread)")
    parser.add_argument("--model-impls", default="auto",
                        help="comma-separated model_impl values to run in turn, e.g. "
                             "transformers,gapless (mode names are then prefixed with the impl)")
    parser.add_argument("--baseline", default=None,
                        help="transformers generate_batch modes (sync, async) or none "
                             "(default: async on CUDA, none on a CPU, where it is slow)")
    parser.add_argument("--baseline-new", type=int, default=None,
                        help="new tokens for the baseline (default: --new)")
    parser.add_argument("--telemetry-cost", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-new", type=int, default=128)
    add_fused_arguments(parser)


def run_once(eng, prompts: list[list[int]], new: int) -> dict:
    from engine import SamplingParams
    from telemetry.collect import StepCollector
    from telemetry.metrics import busy_fraction, idle_gaps, spans_of

    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
    with StepCollector(eng.bus) as collector:  # every step, not the ring's last 4,096
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        wall = time.perf_counter() - t0
    assert all(len(o.token_ids) == new for o in outs)
    assert collector.dropped_steps == 0, f"{collector.dropped_steps} step records lost"
    recs = collector.records
    res = {"wall_s": wall, "tokens": len(prompts) * new, "tok_s": len(prompts) * new / wall,
           "steps": len(recs), "outputs": [o.token_ids for o in outs]}
    if recs:
        spans = spans_of(recs)
        start = min(s.start_ns for s in spans)
        end = max(s.end_ns for s in spans)
        gaps = idle_gaps(spans, start, end, lane="compute")
        res.update(busy=busy_fraction(spans, start, end, lane="compute"),
                   idle_s=gaps.total_ns / 1e9, gaps=gaps.count,
                   largest_gap_ms=gaps.largest_ns / 1e6,
                   graph_steps=sum(r.graph_bucket is not None for r in recs))
    return res


def profiler_busy(eng, prompts: list[list[int]], new: int, trace_path: Path) -> dict:
    """GPU busy from torch.profiler's kernel timeline: union of kernel intervals over the span
    from the first to the last kernel, beside our own figure for the same run."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ours = run_once(eng, prompts, new)
    prof.export_chrome_trace(str(trace_path))
    kernels = [(e["ts"], e["ts"] + e["dur"]) for e in trace.device_events(trace_path)
               if e["cat"] == "kernel"]
    busy = None
    if kernels:
        start, end = min(a for a, _ in kernels), max(b for _, b in kernels)
        busy = union_length(kernels) / (end - start) if end > start else None
    return {"ours_busy": ours.get("busy"), "profiler_busy": busy,
            "kernels": len(kernels), "wall_s": ours["wall_s"]}


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Share of requests identical, and share of tokens before the first divergence."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = 0
    for x, y in zip(a, b, strict=True):
        prefix += next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
    return {"identical_requests": same / len(a),
            "tokens_before_divergence": prefix / sum(len(x) for x in a)}


def make_engine(model, args: argparse.Namespace, telemetry: bool = True,
                model_impl: str = "auto"):
    from engine import Engine, EngineConfig

    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.requests, max_num_batched_tokens=args.budget,
        max_model_len=args.prompt + args.new + 16, block_size=16,
        async_batching=True, num_slots=2, cuda_graphs=args.device == "cuda",
        telemetry=telemetry, model_impl=model_impl, **fused_config(args),
    )
    return Engine(cfg, model=model, tokenizer=None)


def run_modes(eng, impl: str, args, prompts, tokens: dict, runs: dict) -> None:
    """Every mode of --modes, --repeats times, alternating the order each repeat."""
    modes = [m for m in args.modes.split(",") if m]
    many = len(args.model_impls.split(",")) > 1
    for i in range(args.repeats):
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            sync_or_async, graphs = mode.split("-")
            name = f"{impl}:{mode}" if many else mode
            if graphs == "graphs" and not eng.settings()["cuda_graphs_available"]:
                if i == 0:
                    print(f"skip {name}: {eng.settings()['cuda_graphs_reason']}")
                continue
            eng.configure(async_batching=sync_or_async == "async",
                          cuda_graphs=graphs == "graphs")
            r = run_once(eng, prompts, args.new)
            outs = r.pop("outputs")
            reference = next(iter(tokens.values()), outs)
            r["same_tokens_as_first_mode"] = outs == reference
            tokens.setdefault(name, outs)
            runs.setdefault(name, []).append(r)
            print(name, json.dumps(r), flush=True)


def mode_row(name: str, rs: list[dict], floor_s: float) -> list:
    wall = Samples([r["wall_s"] for r in rs])
    med = min(rs, key=lambda r: abs(r["wall_s"] - wall.median))  # the run nearest the median
    return [name, f"{wall.median:.2f}", f"{wall.spread:.1%}", len(rs),
            f"{med['tokens'] / wall.median:.0f}", f"{med.get('busy', 0):.1%}",
            f"{med.get('idle_s', 0):.2f}", med.get("gaps", 0),
            f"{med.get('largest_gap_ms', 0):.2f}", med.get("graph_steps", 0),
            f"{wall.median / floor_s:.1f}"]


def run(args: argparse.Namespace, out: Path) -> dict:
    t = time.perf_counter()
    model = model_from_args(args)
    print(f"model {args.preset} built in {time.perf_counter() - t:.1f} s", flush=True)
    vocab = model.config.vocab_size
    prompts = random_prompts(args.requests, args.prompt, vocab)
    floor_s = ByteFloor.of(model).decode_seconds(args.requests, args.prompt, args.new)
    runs: dict[str, list[dict]] = {}
    tokens: dict[str, list[list[int]]] = {}
    extra: dict[str, dict] = {}
    impls = args.model_impls.split(",")
    eng = None
    for impl in impls:
        if eng is not None:
            eng.shutdown()
            torch.cuda.empty_cache() if args.device == "cuda" else None
        t = time.perf_counter()
        eng = make_engine(model, args, model_impl=impl)
        print(f"engine ready in {time.perf_counter() - t:.1f} s: {eng.settings()}", flush=True)
        # Warm-up at the full batch and prompt length: the first prefill of a shape compiles
        # its Triton kernels (seen as one 268 ms gap in the first fused-path run).
        run_once(eng, random_prompts(args.requests, args.prompt, vocab, seed=1), 4)
        run_modes(eng, impl, args, prompts, tokens, runs)
    names = list(tokens)
    extra["token_agreement"] = {f"{a} vs {b}": agreement(tokens[a], tokens[b])
                                for i, a in enumerate(names) for b in names[i + 1:]}
    print("token agreement", json.dumps(extra["token_agreement"]), flush=True)
    if args.profile:
        eng.configure(cuda_graphs=eng.settings()["cuda_graphs_available"])
        for mode in ("sync", "async"):
            eng.configure(async_batching=mode == "async")
            extra[f"profile-{mode}"] = profiler_busy(eng, prompts, args.profile_new,
                                                     out / f"profile_{mode}.trace.json")
    eng.shutdown()
    del eng
    if args.telemetry_cost:
        extra["telemetry_cost"] = telemetry_cost(model, args, prompts, impls[-1])
    baseline = {}
    base_modes = args.baseline or ("async" if args.device == "cuda" else "none")
    if base_modes != "none":
        del model  # a fresh model: the engine may have changed the one it served
        torch.cuda.empty_cache() if args.device == "cuda" else None
        fresh = model_from_args(args)
        baseline = baselines.transformers_modes(fresh, prompts, args.baseline_new or args.new,
                                                base_modes.split(","))
    return write(out, args, floor_s, runs, baseline, extra)


def telemetry_cost(model, args, prompts, impl: str) -> dict:
    costs: dict[bool, list[float]] = {}
    for telemetry in (True, False, True, False):
        e = make_engine(model, args, telemetry=telemetry, model_impl=impl)
        e.configure(async_batching=True, cuda_graphs=args.device == "cuda")
        run_once(e, prompts[:4], 8)
        r = run_once(e, prompts, args.new)
        r.pop("outputs")
        costs.setdefault(telemetry, []).append(r["tok_s"])
        e.shutdown()
        print(f"telemetry={telemetry}", json.dumps(r), flush=True)
    return {"on_tok_s": max(costs[True]), "off_tok_s": max(costs[False]),
            "cost_pct": 100 * (1 - max(costs[True]) / max(costs[False]))}


def write(out: Path, args, floor_s: float, runs: dict, baseline: dict, extra: dict) -> dict:
    headers = ["mode", "wall (s)", "spread", "runs", "tok/s", "GPU busy", "idle (s)", "gaps",
               "largest gap (ms)", "graph steps", "x floor"]
    rows = [mode_row(name, rs, floor_s) for name, rs in runs.items()]
    base_new = args.baseline_new or args.new
    for mode, r in baseline.items():
        scale = args.new / base_new  # x floor only comparable at the same workload
        rows.append([f"transformers generate_batch {mode}", f"{r['wall_s']:.2f}", "", 1,
                     f"{r['tok_s']:.0f}", "", "", "", "", "",
                     f"{r['wall_s'] / floor_s:.1f}" if scale == 1 else ""])
    sections = [f"{args.requests} x ({args.prompt} prompt + {args.new} new tokens), "
                f"{args.preset}, greedy, no EOS. Floor (weights + KV bytes / 4.22 TB/s): "
                f"{floor_s:.2f} s" + (f"; transformers ran {base_new} new tokens"
                                       if base_new != args.new else ""),
                report.markdown_table(headers, rows)]
    for mode in ("profile-sync", "profile-async"):
        if mode in extra:
            p = extra[mode]
            prof = "n/a" if p["profiler_busy"] is None else f"{p['profiler_busy']:.1%}"
            sections.append(f"{mode}: ours {p['ours_busy']:.1%} vs torch.profiler {prof} "
                            f"({p['kernels']} kernels)")
    if "telemetry_cost" in extra:
        c = extra["telemetry_cost"]
        sections.append(f"telemetry on {c['on_tok_s']:.0f} tok/s, off {c['off_tok_s']:.0f} "
                        f"tok/s: cost {c['cost_pct']:.2f}%")
    data = {"floor_s": floor_s, "runs": runs, "transformers": baseline, **extra}
    report.emit(out, "async_vs_sync", f"Sync vs async, {args.preset}", sections, data)
    return {"floor_s": floor_s, "rows": [dict(zip(headers, r, strict=True)) for r in rows],
            "transformers": baseline, "token_agreement": extra.get("token_agreement")}
