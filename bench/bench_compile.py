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

    python bench/bench_compile.py --preset llama-1b          # GPU: random bf16 weights
    python bench/bench_compile.py --preset llama-8b --batches 1,32 --prefill 512
    python bench/bench_compile.py --model models/SmolLM2-135M-Instruct --device cpu --engine
    python bench/bench_compile.py --preset tiny --device cpu --cache-dir /tmp/ic  # 2nd: warm

Start-up figures are for a cold inductor cache unless --cache-dir names one already filled
(run the same command twice to see the warm figure).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        default=None,
        help="a shape from bench/model_shapes.py "
        "(random weights): tiny, smollm2-135m, llama-1b, llama-8b, qwen3-0.6b",
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
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.preset is None and args.model is None:
        args.preset = "tiny"
    return args


def main() -> None:
    args = parse_args()
    # Before torch is imported, so the first compile cannot read an older cache.
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="gapless-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    import torch

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
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


def load_model(args: argparse.Namespace, device, dtype):
    if args.preset is not None:
        from model_shapes import build_model

        return build_model(args.preset, device, dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)


def unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class StepBench:
    """Flat batches for the forward, built by hand on one paged cache: R + 1 requests with
    blocks of their own, a decode step of b tokens (requests 0..b-1 at position `context`) or
    a prefill of p tokens (request R, positions 0..p-1, so it never changes what a decode
    reads)."""

    def __init__(
        self, model, device, dtype, max_batch: int, context: int, prefill: int, block_size: int
    ) -> None:
        import torch

        from engine.attention.interface import resolve_backend
        from engine.model.hf_config import kv_cache_shape, text_config

        self.torch = torch
        self.model, self.device = model, device
        self.vocab = int(text_config(model.config).vocab_size)
        layers, kvh, hd = kv_cache_shape(model.config)
        self.block_size = block_size
        self.width = math.ceil((max(context + 1, prefill) + 1) / block_size)
        self.max_batch = max_batch
        num_blocks = (max_batch + 1) * self.width + 1  # the last row: the prefill's
        self.caches = [
            (
                torch.randn(num_blocks, block_size, kvh, hd, device=device).to(dtype),
                torch.randn(num_blocks, block_size, kvh, hd, device=device).to(dtype),
            )
            for _ in range(layers)
        ]
        self.block_tables = torch.arange(
            (max_batch + 1) * self.width, dtype=torch.int32, device=device
        ).view(max_batch + 1, self.width)
        self.context = context
        self.backend_name, self.backend = resolve_backend("auto", device)
        self.op_backend = self.backend  # compile_forward's, once compiled

    def inputs(self, name: str, n: int, samples: int | None = None) -> dict:
        """The same tensors for the same arguments (the ids are seeded by the shape)."""
        torch = self.torch
        if name == "decode":
            req = torch.arange(n, dtype=torch.int32)
            pos = torch.full((n,), self.context, dtype=torch.int32)
            keep = torch.arange(n) if samples is None else torch.arange(samples)
        else:
            req = torch.full((n,), self.max_batch, dtype=torch.int32)
            pos = torch.arange(n, dtype=torch.int32)
            keep = torch.tensor([n - 1]) if samples is None else torch.arange(samples) + n - samples
        blocks = self.block_tables.cpu()[req.long(), (pos // self.block_size).long()]
        slots = blocks.long() * self.block_size + (pos % self.block_size).long()
        gen = torch.Generator().manual_seed(2 * n + (name == "decode"))
        ids = torch.randint(1, self.vocab, (n,), generator=gen)
        d = self.device
        return {
            "ids": ids.to(d),
            "pos": pos.to(d),
            "req": req.to(d),
            "slots": slots.to(d),
            "keep": keep.to(d),
        }

    def run(self, x: dict, compiled: bool):
        """One forward; compiled: through the compiled module and the custom op, otherwise
        the module's own forward (nn.Module.compile leaves it eager) and the plain backend."""
        from engine.attention.interface import AttnContext

        ctx = AttnContext(
            kv_caches=self.caches,
            slot_mapping=x["slots"],
            block_tables=self.block_tables,
            token_req=x["req"],
            token_pos=x["pos"],
            backend=self.op_backend if compiled else self.backend,
        )
        call = self.model if compiled else self.model.forward
        out = call(
            input_ids=x["ids"][None],
            position_ids=x["pos"].long()[None],
            logits_to_keep=x["keep"],
            use_cache=False,
            gapless=ctx,
        )
        return out.logits[0]

    def forward(self, name: str, n: int, compiled: bool):
        return self.run(self.inputs(name, n), compiled)

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def time_ms(self, name: str, n: int, iters: int) -> tuple[float, float]:
        """Median ms of one forward (eager, compiled), the two alternating step by step."""
        x = self.inputs(name, n)
        for compiled in (False, True, False, True):
            self.run(x, compiled)
        self.sync()
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(iters):
            for compiled in (False, True):
                t0 = time.perf_counter()
                self.run(x, compiled)
                self.sync()
                times[compiled].append(time.perf_counter() - t0)
        return (
            round(statistics.median(times[False]) * 1e3, 3),
            round(statistics.median(times[True]) * 1e3, 3),
        )

    def graph_time_ms(self, name: str, n: int, iters: int, compiled: bool) -> float:
        """The forward captured in a CUDA graph (as the engine captures compute()), replayed
        `iters` times between two events. Needs the Triton backend (the torch reference
        syncs with the host and cannot be captured)."""
        torch = self.torch
        x = self.inputs(name, n)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.run(x, compiled)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.run(x, compiled)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        del graph
        return round(start.elapsed_time(end) / iters, 3)

    def mixed_run(self, steps: int, batches: list[int], prefill: int) -> dict:
        """Steps of random shape, as a serving engine sees them: decode batches 1..max, and
        prefill chunks 1..prefill that sample 0 or 1 rows. Counts new graphs and the time of
        the steps that compiled."""
        rng = random.Random(0)
        before = unique_graphs()
        compile_s, shapes = 0.0, []
        for _ in range(steps):
            if prefill and rng.random() < 0.4:
                n = rng.randint(1, prefill)
                x = self.inputs("prefill", n, samples=rng.choice((0, 1)))
            else:
                n = rng.randint(1, max(batches))
                x = self.inputs("decode", n)
            graphs = unique_graphs()
            t0 = time.perf_counter()
            self.run(x, compiled=True)
            self.sync()
            if unique_graphs() > graphs:
                compile_s += time.perf_counter() - t0
                shapes.append([int(x["ids"].numel()), int(x["keep"].numel())])
        return {
            "steps": steps,
            "new_graphs": unique_graphs() - before,
            "compiled_at_tokens_samples": shapes,
            "compile_s": round(compile_s, 1),
        }


def engine_run(args: argparse.Namespace, device) -> dict:
    """The real engine on a mixed workload (chunked prefill forced by a small token budget),
    torch_compile off then on: first and second generate wall time, graphs, equal tokens."""
    sys.path.insert(0, str(ROOT / "tests" / "engine"))
    from helpers import mixed_prompts

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


if __name__ == "__main__":
    main()
