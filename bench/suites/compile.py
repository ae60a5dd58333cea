"""torch.compile of the generic path (config key `torch_compile`): what it costs at start-up,
how often it recompiles, and what it saves per step, eager vs compiled.

The model is transformers' modeling code with our paged attention (model_impl 'transformers');
compiled, the attention goes through the custom op `gapless::paged_attention`
(engine.attention.op), exactly as the engine runs it. Per-step figures time the forward alone
(what compile changes; sampling is the same either way) on hand-built flat batches: decode at
each batch size in --batches (one token per request, --context tokens already cached) and one
prefill of --prefill tokens. Then a run of --mixed steps with random sizes (decode batches and
prefill chunks, 0 or 1 sampled rows) counts the graphs dynamo compiles. On CUDA each forward
is also captured in a CUDA graph per shape, as the engine does (--no-graphs to skip).

--engine runs the real engine too (needs --model, a folder with a tokenizer): the same mixed
workload with torch_compile off and on, wall time of a first and a second generate, graphs
compiled, and whether the tokens agree.

    python -m bench compile --preset llama-1b          # GPU: random bf16 weights
    python -m bench compile --preset llama-8b --batches 1,32 --prefill 512
    python -m bench compile --model models/SmolLM2-135M-Instruct --device cpu --engine
    python -m bench compile --preset tiny --device cpu --cache-dir /tmp/ic  # 2nd: warm

Start-up figures are for a cold inductor cache unless --cache-dir names one already filled
(run the same command twice to see the warm figure).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import report

# No torch import at module level: run() names the inductor cache folder first.
ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION = "what torch.compile of the generic path costs at start-up and saves per step"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        default=None,
        help="a shape from bench/harness/shapes.py "
        "(random weights; default tiny): tiny, smollm2-135m, llama-1b, llama-8b, qwen3-0.6b",
    )
    src.add_argument("--model", default=None, help="a local model folder")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    p.add_argument("--batches", default="1,16", help="decode batch sizes, comma-separated")
    p.add_argument("--prefill", type=int, default=128, help="prefill tokens (0: none)")
    p.add_argument("--context", type=int, default=256, help="cached tokens per decode request")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument(
        "--iters", type=int, default=0, help="timed steps per shape (0: 20 on cpu, 100 on cuda)"
    )
    p.add_argument(
        "--mixed",
        type=int,
        default=30,
        help="steps of random size for the recompile count (0: skip)",
    )
    p.add_argument("--no-graphs", action="store_true", help="cuda: skip CUDA graph timing")
    p.add_argument("--engine", action="store_true", help="also run the engine end to end")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default); inductor's C++ kernels use as many",
    )
    p.add_argument("--cache-dir", default=None, help="inductor cache (default: a fresh one)")


def run(args: argparse.Namespace, out: Path) -> dict:
    if args.preset is None and args.model is None:
        args.preset = "tiny"
    # Before torch is imported, so the first compile cannot read an older cache.
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="gapless-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch

    from bench.harness.flat_batches import StepBench, unique_graphs
    from engine.model.loader import prepare_model, resolve_device, resolve_dtype

    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    torch.manual_seed(0)
    model = load_model(args, device, dtype)
    model = prepare_model(model, device, dtype)
    batches = [int(b) for b in args.batches.split(",") if b]
    iters = args.iters or (100 if device.type == "cuda" else 20)
    graphs = device.type == "cuda" and not args.no_graphs
    bench = StepBench(
        model, device, dtype, max(batches), args.context, args.prefill, args.block_size
    )
    shapes = [("decode", b) for b in batches] + (
        [("prefill", args.prefill)] if args.prefill else []
    )
    env = {
        "torch": torch.__version__,
        "device": device.type,
        "dtype": str(dtype),
        "cache_dir": cache_dir,
        "cache_was_empty": not any(Path(cache_dir).iterdir()),
        "model": args.model or f"preset {args.preset} (random weights)",
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
    }
    import transformers

    env["transformers"] = transformers.__version__
    print(json.dumps(env))

    results: dict = {"env": env, "args": vars(args), "steps": {}}
    rows = results["steps"]
    with torch.inference_mode():
        eager_logits = {}
        for name, n in shapes:
            eager_logits[f"{name} {n}"] = bench.forward(name, n, compiled=False).float().cpu()

        from engine.model.compiled import compile_forward

        bench.op_backend = compile_forward(model, bench.backend_name, bench.backend)[1]
        startup = 0.0
        for name, n in shapes:
            key = f"{name} {n}"
            before = unique_graphs()
            t0 = time.perf_counter()
            logits = bench.forward(name, n, compiled=True)
            bench.sync()
            first = time.perf_counter() - t0
            startup += first
            diff = (logits.float().cpu() - eager_logits[key]).abs().max()
            rows[key] = {
                "first_call_s": round(first, 2),
                "graphs_compiled": unique_graphs() - before,
                "max_abs_logit_diff": float(diff),
            }
            print(f"compiled {key:>11}: {rows[key]}", flush=True)
        results["startup_s"] = round(startup, 1)
        for name, n in shapes:  # eager and compiled alternate, so load on the machine hits both
            row = rows[f"{name} {n}"]
            row["eager_ms"], row["compiled_ms"] = bench.time_ms(name, n, iters)
            row["speedup"] = round(row["eager_ms"] / row["compiled_ms"], 2)
            if graphs:
                row["eager_graph_ms"] = bench.graph_time_ms(name, n, iters, compiled=False)
                row["compiled_graph_ms"] = bench.graph_time_ms(name, n, iters, compiled=True)
                row["graph_speedup"] = round(row["eager_graph_ms"] / row["compiled_graph_ms"], 2)
            print(f"timed {name} {n}: {row}", flush=True)
        if args.mixed:
            results["mixed"] = bench.mixed_run(args.mixed, batches, args.prefill)
            print(f"mixed run: {results['mixed']}", flush=True)
    results["graphs_total"] = unique_graphs()
    if args.engine:
        if args.model is None:
            raise SystemExit("--engine needs --model (a folder with a tokenizer)")
        del model, bench
        results["engine"] = engine_run(args, device)
    print_table(results)
    report.write_json(out / "compile.json", results)
    return results


def load_model(args: argparse.Namespace, device, dtype):
    if args.preset is not None:
        from bench.harness.shapes import build_model

        return build_model(args.preset, device, dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)


def engine_run(args: argparse.Namespace, device) -> dict:
    """The real engine on a mixed workload (chunked prefill forced by a small token budget),
    torch_compile off then on: first and second generate wall time, graphs, equal tokens."""
    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from helpers import mixed_prompts

    from bench.harness.flat_batches import unique_graphs
    from engine import Engine, EngineConfig, SamplingParams

    prompts = mixed_prompts(12, vocab=1000, seed=3)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, detokenize=False)
    out: dict = {"requests": len(prompts), "max_tokens": params.max_tokens}
    tokens = {}
    import torch

    for compiled in (False, True):
        # Dynamo's graphs of the bench above hold on to that model and count against its
        # limit of 8 graphs per function: start from nothing, as a fresh engine process does.
        torch._dynamo.reset()
        before = unique_graphs()
        t0 = time.perf_counter()
        cfg = EngineConfig(
            model=args.model,
            device=device.type,
            dtype=args.dtype,
            model_impl="transformers",
            torch_compile=compiled,
            max_num_seqs=8,
            max_num_batched_tokens=64,
            max_model_len=256,
            num_blocks=200,
            block_size=16,
            telemetry=False,
        )
        with Engine(cfg) as eng:
            load_s = time.perf_counter() - t0
            runs = []
            for _ in range(2):
                t1 = time.perf_counter()
                res = eng.generate(prompts, params)
                runs.append(round(time.perf_counter() - t1, 2))
            steps = eng.stats()["steps"]
        tokens[compiled] = [r.token_ids for r in res]
        out["compiled" if compiled else "eager"] = {
            "load_s": round(load_s, 1),
            "first_generate_s": runs[0],
            "second_generate_s": runs[1],
            "steps_per_generate": steps // 2,
            "graphs_compiled": unique_graphs() - before,
        }
        print(f"engine compiled={compiled}: {out['compiled' if compiled else 'eager']}", flush=True)
    out["same_tokens"] = tokens[False] == tokens[True]
    return out


def print_table(r: dict) -> None:
    graphs = any("eager_graph_ms" in row for row in r["steps"].values())
    head = "| step | eager ms | compiled ms | x | first call s | graphs | max logit diff |"
    if graphs:
        head += " eager graph ms | compiled graph ms | x |"
    print("\n" + head)
    print("|" + "---|" * (head.count("|") - 1))
    for key, row in r["steps"].items():
        line = (
            f"| {key} | {row['eager_ms']} | {row['compiled_ms']} | {row['speedup']} | "
            f"{row['first_call_s']} | {row['graphs_compiled']} | "
            f"{row['max_abs_logit_diff']:.2e} |"
        )
        if graphs:
            line += (
                f" {row['eager_graph_ms']} | {row['compiled_graph_ms']} | {row['graph_speedup']} |"
            )
        print(line)
    print(
        f"\nstart-up (first calls of the shapes above): {r['startup_s']} s; "
        f"graphs in all: {r['graphs_total']}"
    )
    if "mixed" in r:
        m = r["mixed"]
        print(
            f"mixed run of {m['steps']} steps: {m['new_graphs']} more graphs "
            f"({m['compile_s']} s compiling) at (tokens, samples) "
            f"{m['compiled_at_tokens_samples']}"
        )
    if "engine" in r:
        print(f"engine: {json.dumps(r['engine'])}")
