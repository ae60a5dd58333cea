"""How fast config.yaml's model serves on this machine, part by part (``--parts``):

    speed   : time to first token and tokens/s at batch 1 and 16, async and sync: chat
              questions through the model's chat template (plain code prompts for a model
              without one), greedy, --new tokens per request, no EOS. A markdown table: median
              over --repeats runs of the time to first token (per request, then the median
              request), the whole batch's tokens/s and the median request's decode tokens/s
    prefill : how prefill time grows with the prompt, and a stream's largest gap beside a long
              prefill (bench/harness/prefill_growth.py)

The model is config.yaml's (SmolLM2-135M-Instruct) unless --model names another, e.g.
models/gapless-tiny-python. By default the speed part.

    python -m bench default-model [--device cpu] [--model DIR]
    python -m bench default-model --parts prefill --model models/gapless-tiny-python
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from bench.harness.prefill_growth import add_prefill_arguments, prefill_growth
from engine import Engine, EngineConfig, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION = ("how fast config.yaml's model serves on this machine: TTFT and tokens/s at "
               "batch 1 and 16, prefill against prompt length")
PARTS = ("speed", "prefill")

QUESTIONS = [
    "What is the capital of France?", "Write a Python function that reverses a string.",
    "Explain what a hash table is.", "Give me three tips for writing clear code.",
    "What does HTTP stand for?", "How do I read a file line by line in Python?",
    "Why is the sky blue?", "Summarise the plot of Hamlet in two sentences.",
]
CODE_PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "    for i in range(",
                "def read_config(path):", "try:\n    import json\nexcept", "if __name__ ==",
                "    return self."]


def prompts_for(tokenizer: object, batch: int) -> list[str]:
    if getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            tokenize=False, add_generation_prompt=True) for i in range(batch)]
    return [CODE_PROMPTS[i % len(CODE_PROMPTS)] for i in range(batch)]


def parse_parts(text: str) -> list[str]:
    """``--parts``: the parts named, in running order; an error naming the known ones."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    if not asked or any(p not in PARTS for p in asked):
        raise argparse.ArgumentTypeError(
            f"parts must be among {', '.join(PARTS)}, comma-separated; got {text!r}")
    return [p for p in PARTS if p in asked]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parts", default=["speed"], type=parse_parts,
                    help=f"comma-separated, of: {', '.join(PARTS)} (default: speed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", help="a model folder instead of config.yaml's")
    group = ap.add_argument_group("speed part")
    group.add_argument("--new", type=int, default=64, help="new tokens per request")
    group.add_argument("--repeats", type=int, default=3, help="runs per row (median)")
    add_prefill_arguments(ap.add_argument_group("prefill part"))


def run(args: argparse.Namespace, out: Path) -> dict:
    summary: dict = {}
    if "speed" in args.parts:
        summary["speed"] = speed(args)
    if "prefill" in args.parts:
        model = args.model or str(EngineConfig.from_yaml(ROOT / "config.yaml").model)
        summary["prefill"] = prefill_growth(args, model, out)
    return summary


def speed(args: argparse.Namespace) -> dict:
    """The TTFT and tokens/s table (module docstring), printed as it is measured."""
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)
    overrides = {"model": args.model} if args.model else {}
    rows = []
    print("| mode | batch | TTFT ms (median request) | tok/s (whole batch) "
          "| per-request decode tok/s |")
    print("|---|---:|---:|---:|---:|")
    for mode in ("async", "sync"):
        cfg = EngineConfig.from_yaml(ROOT / "config.yaml", device=args.device,
                                     async_batching=mode == "async", **overrides)
        with Engine(cfg) as eng:
            eng.generate(prompts_for(eng.tokenizer, 2), SamplingParams(max_tokens=8))  # warm-up
            for batch in (1, 16):
                prompts = prompts_for(eng.tokenizer, batch)
                ttfts, rates, per_req = [], [], []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    outs = eng.generate(prompts, params)
                    wall = time.perf_counter() - t
                    ttfts.append(statistics.median(o.metrics["ttft_s"] for o in outs))
                    rates.append(sum(len(o.token_ids) for o in outs) / wall)
                    per_req.append(statistics.median(o.metrics["decode_tokens_per_s"]
                                                     for o in outs))
                rows.append({"mode": mode, "batch": batch,
                             "ttft_ms": 1000 * statistics.median(ttfts),
                             "tok_s": statistics.median(rates),
                             "request_decode_tok_s": statistics.median(per_req)})
                print(f"| {mode} | {batch} | {1000 * statistics.median(ttfts):.0f} | "
                      f"{statistics.median(rates):.0f} | {statistics.median(per_req):.1f} |",
                      flush=True)
    print(f"\nmodel {cfg.model}, device {args.device}, {args.new} new tokens, greedy, no EOS, "
          f"median of {args.repeats} runs")
    return {"model": str(cfg.model), "device": args.device, "new": args.new, "rows": rows}
