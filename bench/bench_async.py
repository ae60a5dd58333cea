"""Sync vs async batching, CUDA graphs off/on, on a fixed-length workload.

Default workload (issue 3): a Llama-3.1-8B-shaped model with random bf16 weights, 32
requests x (256 prompt + 1024 new tokens), greedy, no EOS. Prints wall time, tokens/s, GPU
busy (union of compute spans), idle gaps, and the floor. Optional: --telemetry-cost (same run
with telemetry off) and --profile (busy measured independently by torch.profiler).

    python bench/bench_async.py                         # on the GPU machine
    python bench/bench_async.py --preset tiny --device cpu --new 32   # smoke run on a CPU
    python bench/bench_async.py --model-impls transformers,gapless --modes async-graphs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_shapes import build_model, weight_bytes  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.model.hf_config import kv_cache_shape  # noqa: E402
from telemetry.collect import StepCollector  # noqa: E402
from telemetry.metrics import busy_fraction, idle_gaps, spans_of  # noqa: E402
from telemetry.records import Span  # noqa: E402

COPY_BW = 4.22e12  # bytes/s, device-to-device copy measured on the lent H200 (DESIGN.md §6)


def floor_seconds(model: torch.nn.Module, n: int, prompt: int, new: int) -> float:
    """(weight bytes + KV bytes read) / bandwidth, summed over decode steps."""
    w = weight_bytes(model)
    layers, kv_heads, head_dim = kv_cache_shape(model.config)
    kv_per_token = 2 * layers * kv_heads * head_dim * 2
    total = 0.0
    for i in range(new):
        total += (w + n * (prompt + i) * kv_per_token) / COPY_BW
    return total


def workload(n: int, prompt: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (prompt,), generator=g).tolist() for _ in range(n)]


def run(eng: Engine, prompts: list[list[int]], new: int) -> dict:
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


def profiler_busy(eng: Engine, prompts: list[list[int]], new: int, trace_path: str) -> dict:
    """GPU busy from torch.profiler's kernel timeline: union of kernel intervals over the span
    from the first to the last kernel, beside our own figure for the same run."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ours = run(eng, prompts, new)
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    # Kernel intervals (microseconds) as compute-lane spans, so the same union maths as our
    # own figure (telemetry.metrics) measures them.
    kernels = [Span("compute", int(e["ts"] * 1000), int((e["ts"] + e["dur"]) * 1000))
               for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    busy = None
    if kernels:
        start = min(k.start_ns for k in kernels)
        end = max(k.end_ns for k in kernels)
        busy = busy_fraction(kernels, start, end) if end > start else None
    return {"ours_busy": ours.get("busy"), "profiler_busy": busy,
            "kernels": len(kernels), "wall_s": ours["wall_s"]}


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Share of requests identical, and share of tokens before the first divergence."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = 0
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), len(x))
        prefix += n
    return {"identical_requests": same / len(a),
            "tokens_before_divergence": prefix / sum(len(x) for x in a)}


def make_engine(model, args, telemetry: bool = True, model_impl: str = "auto") -> Engine:
    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.requests, max_num_batched_tokens=args.budget,
        max_model_len=args.prompt + args.new + 16, block_size=16,
        async_batching=True, num_slots=2, cuda_graphs=args.device == "cuda",
        telemetry=telemetry, model_impl=model_impl,
    )
    return Engine(cfg, model=model, tokenizer=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=2048)
    ap.add_argument("--modes", default="sync-eager,async-eager,sync-graphs,async-graphs")
    ap.add_argument("--telemetry-cost", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-new", type=int, default=128)
    ap.add_argument("--model-impls", default="auto",
                    help="comma-separated model_impl values to run in turn, e.g. "
                         "transformers,gapless (mode names are then prefixed with the impl)")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "artifacts"))
    out_dir.mkdir(parents=True, exist_ok=True)

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    t = time.perf_counter()
    model = build_model(args.preset, device, dtype)
    print(f"model {args.preset} built in {time.perf_counter() - t:.1f} s", flush=True)
    vocab = model.config.vocab_size
    prompts = workload(args.requests, args.prompt, vocab)
    floor = floor_seconds(model, args.requests, args.prompt, args.new)
    results: dict[str, dict] = {}
    reference = None
    tokens: dict[str, list[list[int]]] = {}
    impls = args.model_impls.split(",")
    for impl in impls:
        t = time.perf_counter()
        eng = make_engine(model, args, model_impl=impl)
        print(f"engine ready in {time.perf_counter() - t:.1f} s: {eng.settings()}", flush=True)
        # Warm-up at the full batch and prompt length: the first prefill of a shape compiles
        # its Triton kernels (seen as one 268 ms gap in the first fused-path run).
        run(eng, workload(args.requests, args.prompt, vocab, seed=1), 4)
        for mode in args.modes.split(","):
            sync_or_async, graphs = mode.split("-")
            name = f"{impl}:{mode}" if len(impls) > 1 else mode
            if graphs == "graphs" and not eng.settings()["cuda_graphs_available"]:
                print(f"skip {name}: {eng.settings()['cuda_graphs_reason']}")
                continue
            eng.configure(async_batching=sync_or_async == "async",
                          cuda_graphs=graphs == "graphs")
            r = run(eng, prompts, args.new)
            outs = r.pop("outputs")
            r["same_tokens_as_first_mode"] = reference is None or outs == reference
            reference = reference or outs
            tokens[name] = outs
            results[name] = r
            print(name, json.dumps(r), flush=True)
        if impl != impls[-1]:
            eng.shutdown()
            del eng
            torch.cuda.empty_cache() if device.type == "cuda" else None
    names = list(tokens)
    results["token_agreement"] = {
        f"{a} vs {b}": _agreement(tokens[a], tokens[b])
        for i, a in enumerate(names) for b in names[i + 1:]
    }
    print("token agreement", json.dumps(results["token_agreement"]), flush=True)
    if args.profile:
        eng.configure(async_batching=True, cuda_graphs=eng.settings()["cuda_graphs_available"])
        for mode in ("sync", "async"):
            eng.configure(async_batching=mode == "async")
            results[f"profile-{mode}"] = profiler_busy(
                eng, prompts, args.profile_new, f"/tmp/gapless_profile_{mode}.json")
            print(f"profile-{mode}", json.dumps(results[f"profile-{mode}"]), flush=True)
    eng.shutdown()
    del eng
    if args.telemetry_cost:
        graphs = device.type == "cuda"
        costs = {}
        for telemetry in (True, False, True, False):
            e = make_engine(model, args, telemetry=telemetry, model_impl=impls[-1])
            e.configure(async_batching=True, cuda_graphs=graphs)
            run(e, prompts[:4], 8)
            r = run(e, prompts, args.new)
            r.pop("outputs")
            costs.setdefault(telemetry, []).append(r["tok_s"])
            e.shutdown()
            print(f"telemetry={telemetry}", json.dumps(r), flush=True)
        results["telemetry_cost"] = {
            "on_tok_s": max(costs[True]), "off_tok_s": max(costs[False]),
            "cost_pct": 100 * (1 - max(costs[True]) / max(costs[False])),
        }
    meta = {"preset": args.preset, "requests": args.requests, "prompt": args.prompt,
            "new": args.new, "model_impls": impls,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "floor_s": floor,
            "date": time.strftime("%Y-%m-%d")}
    (out_dir / "bench_async.json").write_text(json.dumps({"meta": meta, "results": results},
                                                          indent=1))
    print(f"\nfloor (weights + KV bytes / {COPY_BW / 1e12:.2f} TB/s): {floor:.2f} s")
    print("| mode | wall (s) | tok/s | GPU busy | idle (s) | gaps | largest gap (ms) | "
          "graph steps | x floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        if "wall_s" not in r or mode.startswith("profile"):
            continue
        print(f"| {mode} | {r['wall_s']:.2f} | {r['tok_s']:.0f} | {r.get('busy', 0):.1%} | "
              f"{r.get('idle_s', 0):.2f} | {r.get('gaps', 0)} | {r.get('largest_gap_ms', 0):.2f}"
              f" | {r.get('graph_steps', 0)} | {r['wall_s'] / floor:.1f} |")
    for mode in ("profile-sync", "profile-async"):
        if mode in results:
            p = results[mode]
            prof = "n/a" if p["profiler_busy"] is None else f"{p['profiler_busy']:.1%}"
            print(f"{mode}: ours {p['ours_busy']:.1%} vs torch.profiler {prof}"
                  f" ({p['kernels']} kernels)")
    if "telemetry_cost" in results:
        c = results["telemetry_cost"]
        print(f"telemetry on {c['on_tok_s']:.0f} tok/s, off {c['off_tok_s']:.0f} tok/s: "
              f"cost {c['cost_pct']:.2f}%")


if __name__ == "__main__":
    main()
