"""Anatomy of one decode step: its kernels from torch.profiler, grouped by family, against the
step's byte floor, for model_impl transformers vs gapless.

The engine runs sync with CUDA graphs (so each step is one graph replay between the slot's
H2D copy and its D2H copy); `batch` requests of `context` prompt tokens are prefilled first,
then `steps` pure decode steps are profiled. Steps are split at each H2D copy. Per family:
kernels per step, kernel time per step, and achieved bandwidth where the bytes are known
(GEMMs read the weights, attention reads the KV cache). Summary: kernels per step and per
layer, kernel time, gaps between kernels inside a step, step span (first kernel to last),
the floor ((weight + KV bytes) / 4.22 TB/s) and span / floor.

    python bench/bench_anatomy.py --preset llama-8b --batch 32          # on the H200
    python bench/bench_anatomy.py --preset llama-1b --batch 32
    python bench/bench_anatomy.py --preset tiny --device cpu --batch 4   # CPU smoke (no kernels)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_shapes import build_model, weight_bytes  # noqa: E402

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.model.hf_config import kv_cache_shape  # noqa: E402

COPY_BW = 4.22e12  # bytes/s, device-to-device copy on the lent H200 (DESIGN.md §6)

# First match wins; patterns are matched against the lower-cased kernel name.
FAMILIES: list[tuple[str, str]] = [
    ("attention", r"paged_attention|reduce_splits|flash|fmha|attn"),
    ("gemm", r"gemm|gemv|nvjet|cutlass|xmma|cublas|splitk|matmul"),
    ("rotary", r"rope|rotary|cos_kernel|sin_kernel|catarraybatchedcopy|neg_kernel"),
    ("norm", r"rms_norm|rmsnorm|meanops|pow_tensor|rsqrt"),
    ("sampling", r"argmax|argmin|sort|topk|softmax|multinomial|cumsum|radix|exponential"),
    ("copies", r"memcpy|memset|copy|index|gather|scatter|embedding"),
    ("elementwise", r"elementwise|silu|mul|add|where|fill|activation|reduce"),
]
_COMPILED = [(name, re.compile(p)) for name, p in FAMILIES]


def family_of(kernel_name: str) -> str:
    low = kernel_name.lower()
    for name, pat in _COMPILED:
        if pat.search(low):
            return name
    return "other"


def device_events(trace_path: str) -> list[dict]:
    """Kernel, memcpy and memset events of a chrome trace, sorted by start."""
    data = json.loads(Path(trace_path).read_text())
    events = [e for e in data.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(events, key=lambda e: e["ts"])


def split_steps(events: list[dict]) -> list[list[dict]]:
    """One list of events per step, a step starting at each host-to-device copy."""
    steps: list[list[dict]] = []
    for e in events:
        if e["cat"] == "gpu_memcpy" and "htod" in e["name"].lower().replace(" ", ""):
            steps.append([])
        if steps:
            steps[-1].append(e)
    return [s for s in steps if any(e["cat"] == "kernel" for e in s)]


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def analyse(steps: list[list[dict]]) -> dict:
    n = len(steps)
    fam: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "us": 0.0})
    names: dict[str, float] = defaultdict(float)
    spans, busy = [], []
    for step in steps:
        kernels = [e for e in step if e["cat"] == "kernel"]
        for e in step:
            f = "copies" if e["cat"] != "kernel" else family_of(e["name"])
            fam[f]["count"] += 1
            fam[f]["us"] += e["dur"]
            if f == "other":
                names[e["name"][:90]] += e["dur"]
        start = min(e["ts"] for e in kernels)
        end = max(e["ts"] + e["dur"] for e in kernels)
        spans.append(end - start)
        busy.append(union_us([(e["ts"], e["ts"] + e["dur"]) for e in kernels]))
    per_step = {k: {"count": v["count"] / n, "us": v["us"] / n} for k, v in fam.items()}
    return {"steps": n, "families": per_step, "span_us": sum(spans) / n,
            "kernel_busy_us": sum(busy) / n,
            "other_kernels": sorted(names.items(), key=lambda kv: -kv[1])[:8]}


def run_impl(hf_model: torch.nn.Module, impl: str, args: argparse.Namespace) -> dict:
    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.batch, max_num_batched_tokens=max(2048, args.batch),
        max_model_len=args.context + args.warmup + args.steps + 32, block_size=16,
        async_batching=False, num_slots=2, cuda_graphs=args.device == "cuda",
        telemetry=False, model_impl=impl, graph_buckets=[args.batch],  # decode only
    )
    eng = Engine(cfg, model=hf_model, tokenizer=None, start=False)
    g = torch.Generator().manual_seed(0)
    vocab = hf_model.config.vocab_size
    params = SamplingParams(max_tokens=args.warmup + args.steps + 16, temperature=0.0,
                            ignore_eos=True, detokenize=False)
    for _ in range(args.batch):
        eng.submit(torch.randint(1, vocab, (args.context,), generator=g).tolist(), params)
    while eng.stats()["generated_tokens"] < args.batch:  # prefill (and first tokens)
        eng.step()
    for _ in range(args.warmup):
        eng.step()
    res: dict = {"settings": eng.settings()}
    if args.device != "cuda":
        t = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        res["wall_ms_per_step"] = (time.perf_counter() - t) * 1e3 / args.steps
        eng.shutdown()
        return res
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(args.steps):
            eng.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    trace = os.path.join(tempfile.mkdtemp(), f"anatomy_{impl}.json")
    prof.export_chrome_trace(trace)
    res.update(analyse(split_steps(device_events(trace))))
    res["wall_ms_per_step"] = wall * 1e3 / args.steps
    eng.shutdown()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama-8b")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--impls", default="transformers,gapless")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "artifacts"))
    out_dir.mkdir(parents=True, exist_ok=True)

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hf = build_model(args.preset, device, dtype)
    layers, kvh, head_dim = kv_cache_shape(hf.config)
    w_bytes = weight_bytes(hf)
    ctx = args.context + args.warmup + args.steps // 2
    kv_bytes = args.batch * ctx * 2 * layers * kvh * head_dim * dtype.itemsize
    floor_us = (w_bytes + kv_bytes) / COPY_BW * 1e6
    print(f"{args.preset}: batch {args.batch}, context ~{ctx}: weights {w_bytes / 1e9:.2f} GB, "
          f"KV read {kv_bytes / 1e9:.3f} GB, floor {floor_us:.0f} us "
          f"({COPY_BW / 1e12:.2f} TB/s)", flush=True)
    results = {}
    for impl in args.impls.split(","):
        r = run_impl(hf, impl, args)
        results[impl] = r
        if "families" not in r:
            print(f"{impl}: {r['wall_ms_per_step']:.2f} ms/step (no kernel timeline on "
                  f"{args.device})")
            continue
        print(f"\n### {impl} ({r['settings']['model_impl']}), {r['steps']} steps profiled")
        print("| family | kernels/step | time/step (us) | share | GB/s | % of 4.22 TB/s |")
        print("|---|---:|---:|---:|---:|---:|")
        total = sum(f["us"] for f in r["families"].values())
        bytes_of = {"gemm": w_bytes, "attention": kv_bytes}
        for name in [n for n, _ in FAMILIES] + ["other"]:
            f = r["families"].get(name)
            if f is None:
                continue
            bw = bytes_of.get(name)
            gbs = f"{bw / (f['us'] * 1e-6) / 1e9:.0f}" if bw and f["us"] else ""
            pct = f"{bw / (f['us'] * 1e-6) / COPY_BW:.0%}" if bw and f["us"] else ""
            print(f"| {name} | {f['count']:.0f} | {f['us']:.0f} | {f['us'] / total:.0%} | "
                  f"{gbs} | {pct} |")
        count = sum(f["count"] for f in r["families"].values())
        gaps = r["span_us"] - r["kernel_busy_us"]
        print(f"kernels/step {count:.0f} ({count / layers:.1f} per layer); kernel time "
              f"{total:.0f} us; step span {r['span_us']:.0f} us (gaps inside {gaps:.0f} us); "
              f"floor {floor_us:.0f} us; span/floor {r['span_us'] / floor_us:.2f}x; "
              f"wall {r['wall_ms_per_step']:.2f} ms/step (sync, incl. CPU)")
        if r["other_kernels"]:
            print("unclassified:", "; ".join(f"{n} {us / r['steps']:.0f} us"
                                             for n, us in r["other_kernels"]))
    meta = {"preset": args.preset, "batch": args.batch, "context": ctx,
            "weight_bytes": w_bytes, "kv_bytes": kv_bytes, "floor_us": floor_us,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    path = out_dir / f"bench_anatomy_{args.preset}.json"
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
