"""The kernel sampler's cost: decode throughput with the sampler on against off, alternated
pairs (bench/harness/sampler_cost.py), per cost variant.

    python -m bench truth-cost --cost-period 1 --pair-new 768                # 8B b32 on a GPU
    python -m bench truth-cost --device cpu --preset tiny --batch 4 --dtype float32 \\
        --pairs 1 --pair-new 8                                              # CPU dry run
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench.harness import report
from bench.harness.sampler_cost import VARIANTS, add_cost_arguments, cost_markdown, cost_pairs
from bench.harness.shapes import build_model
from bench.harness.truth_engine import add_shape_arguments
from bench.harness.workload import random_prompts

DESCRIPTION = ("what the kernel sampler costs: decode throughput with it on vs off, alternated "
               "pairs")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shape_arguments(parser)
    add_cost_arguments(parser)
    parser.add_argument("--cost-variants", default="on",
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")


def run(args: argparse.Namespace, out: Path) -> dict:
    model = build_model(args.preset, torch.device(args.device), getattr(torch, args.dtype))
    prompts = random_prompts(args.batch, args.prompt, model.config.vocab_size)
    t = time.perf_counter()
    costs = {}
    for v in args.cost_variants.split(","):
        costs[v] = cost_pairs(model, prompts, args, v)
        print("\n".join(cost_markdown(costs[v])), flush=True)
    summary = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
               "preset": args.preset, "batch": args.batch, "sampler_cost": costs,
               "seconds": time.perf_counter() - t, "commit": report.short_commit()}
    report.write_json(out / "truth_cost.json", summary)
    text = "\n\n".join("\n".join(cost_markdown(c)) for c in costs.values()) + "\n"
    (out / "truth_cost.md").write_text(text)
    print(text, flush=True)
    return summary
