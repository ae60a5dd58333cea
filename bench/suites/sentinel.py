"""The async-correctness sentinel: its mismatch rate under load with live switches,
and what it costs at 1 in 64 sampled.

- `load`: N greedy requests (default 1,000) submitted to a running async engine in waves while
  another thread flips the live settings (async on/off, 1-3 slots, CUDA graphs on/off where
  available) every --switch-every-s; the sentinel checks every request (--sample-every 1).
  Reports requests checked, mismatches, skipped, and how many switches happened.
- `cost`: the same fixed workload (R x (prompt + new), greedy, no EOS) with the sentinel off
  and at 1 in --cost-every (64), alternated (A B, B A, ...) --pairs times on one engine; the
  cost is the median of the on/off wall-time ratios minus 1. The sampling counter runs across
  runs, so the on-runs together check (on-runs x R) / 64 requests, the rate it would have.

    python -m bench sentinel --device cpu --preset tiny --requests 1000          # CPU
    python -m bench sentinel --device cuda --preset llama-8b --parts cost --pairs 5
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import torch

from bench.harness import report
from bench.harness.timing import alternated_pairs
from bench.harness.workload import add_model_arguments, model_from_args, random_prompts
from engine.config import NUM_SLOTS

DESCRIPTION = ("whether async batching ever changes a token under live switches, and what "
               "checking costs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, preset="tiny")
    parser.add_argument("--parts", default="load,cost", help="load, cost or both")
    parser.add_argument("--requests", type=int, default=1000, help="load: requests")
    parser.add_argument("--sample-every", type=int, default=1, help="load: 1 in N checked")
    parser.add_argument("--switch-every-s", type=float, default=0.5)
    parser.add_argument("--cost-every", type=int, default=64)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--cost-requests", type=int, default=64)
    parser.add_argument("--cost-prompt", type=int, default=None,
                        help="default: 128 on cuda, 64 on cpu")
    parser.add_argument("--cost-new", type=int, default=None,
                        help="default: 256 on cuda, 64 on cpu")


def make_engine(model, args: argparse.Namespace, max_seqs: int, max_len: int,
                sample_every: int):
    from engine import Engine, EngineConfig

    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=max_seqs, max_num_batched_tokens=256 if args.device == "cpu" else 2048,
        max_model_len=max_len, block_size=16, async_batching=True, num_slots=2,
        cuda_graphs=args.device == "cuda", telemetry=False, prefix_caching=False,
        sentinel_sample_every=sample_every,
    )
    return Engine(cfg, model=model, tokenizer=None)


def wait_checks(eng, timeout_s: float = 600.0) -> dict:
    """The engine's stats once no sentinel check is queued (the idle loop finishes them)."""
    t_end = time.monotonic() + timeout_s
    while True:
        stats = eng.stats()
        if stats["sentinel_queued"] == 0 or time.monotonic() > t_end:
            return stats
        time.sleep(0.05)


def run_load(model, args: argparse.Namespace, vocab: int) -> dict:
    from engine import SamplingParams

    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(2, 64, (args.requests,), generator=g).tolist()
    news = torch.randint(1, 24, (args.requests,), generator=g).tolist()
    eng = make_engine(model, args, max_seqs=16, max_len=96, sample_every=args.sample_every)
    graphs = bool(eng.settings()["cuda_graphs_available"])
    stop = threading.Event()
    switches: list[dict] = []

    def flip() -> None:
        i = 0
        combos = [(a, s, gr) for gr in ((False, True) if graphs else (False,))
                  for s in NUM_SLOTS for a in (True, False)]
        while not stop.wait(args.switch_every_s):
            a, s, gr = combos[i % len(combos)]
            i += 1
            eng.configure(async_batching=a, num_slots=s, cuda_graphs=gr if graphs else None)
            switches.append({"async": a, "slots": s, "graphs": gr})

    flipper = threading.Thread(target=flip, daemon=True)
    t0 = time.perf_counter()
    try:
        flipper.start()
        handles = []
        for i, (n, new) in enumerate(zip(lengths, news, strict=True)):
            prompt = torch.randint(1, vocab, (n,), generator=g).tolist()
            params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True,
                                    detokenize=False)
            handles.append(eng.submit(prompt, params))
            if i % 64 == 63:  # waves: the queue never holds the whole load
                for h in handles[-64:]:
                    h.result()
        outs = [h.result() for h in handles]
        stop.set()
        flipper.join()
        stats = wait_checks(eng)
    finally:
        stop.set()
        eng.shutdown()
    wall = time.perf_counter() - t0
    finished = sum(o.finish_reason == "length" for o in outs)
    return {"requests": args.requests, "finished_length": finished,
            "sample_every": args.sample_every, "switches": len(switches),
            "graphs_available": graphs, "wall_s": wall,
            **{k: v for k, v in stats.items() if k.startswith("sentinel_")},
            "mismatch_rate": stats["sentinel_mismatches"] / max(1, stats["sentinel_checked"])}


def run_cost(model, args: argparse.Namespace, vocab: int) -> dict:
    from engine import SamplingParams

    cuda = args.device == "cuda"
    prompt = args.cost_prompt or (128 if cuda else 64)
    new = args.cost_new or (256 if cuda else 64)
    n = args.cost_requests
    prompts = random_prompts(n, prompt, vocab, seed=0)
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
    eng = make_engine(model, args, max_seqs=n, max_len=prompt + new + 16, sample_every=0)
    try:
        eng.generate(random_prompts(n, prompt, vocab, seed=1), params)  # warm-up

        def run(every: int) -> float:
            eng.configure(sentinel_sample_every=every)
            t0 = time.perf_counter()
            eng.generate(prompts, params)
            wall = time.perf_counter() - t0
            if every:  # the checks that ran during the run cost what they cost; finish the
                wait_checks(eng)  # rest outside the timing (they would run in idle time)
            return wall

        pairs = alternated_pairs(lambda: run(0), lambda: run(args.cost_every), args.pairs)
        stats = eng.stats()
    finally:
        eng.shutdown()
    ratio = pairs.ratios.median
    return {"requests": n, "prompt": prompt, "new": new, "sample_every": args.cost_every,
            "pairs": pairs.summary(), "cost": ratio - 1.0,
            **{k: v for k, v in stats.items() if k.startswith("sentinel_")}}


def run(args: argparse.Namespace, out: Path) -> dict:
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in parts:
        if p not in ("load", "cost"):
            raise SystemExit(f"--parts takes load and/or cost, got {p!r}")
    if args.device == "cpu" and args.dtype == "bfloat16":
        args.dtype = "float32"  # bf16 matmuls are slow on a CPU; the check is the same
    model = model_from_args(args)
    vocab = int(model.config.vocab_size)
    summary: dict = {"preset": args.preset, "device": args.device, "dtype": args.dtype}
    sections = []
    if "load" in parts:
        load = run_load(model, args, vocab)
        summary["load"] = load
        sections.append(report.markdown_table(
            ["requests", "checked", "mismatches", "mismatch rate", "skipped", "live switches",
             "graphs", "wall s"],
            [[load["requests"], load["sentinel_checked"], load["sentinel_mismatches"],
              f"{load['mismatch_rate']:.4f}", load["sentinel_skipped"], load["switches"],
              "yes" if load["graphs_available"] else "n/a", f"{load['wall_s']:.1f}"]]))
    if "cost" in parts:
        cost = run_cost(model, args, vocab)
        summary["cost"] = cost
        p = cost["pairs"]
        sections.append(report.markdown_table(
            ["workload", "1 in", "pairs", "off s (median)", "on s (median)", "on/off median",
             "cost", "checked"],
            [[f"{cost['requests']} x ({cost['prompt']}+{cost['new']})", cost["sample_every"],
              p["a"]["n"], f"{p['a']['median']:.3f}", f"{p['b']['median']:.3f}",
              f"{p['b_over_a']['median']:.4f}", f"{100 * cost['cost']:+.2f}%",
              cost["sentinel_checked"]]]))
    report.emit(out, "sentinel", "Async-correctness sentinel", sections, summary)
    return summary
