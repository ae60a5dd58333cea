"""What watching the engine costs, part by part (``--parts``, comma-separated):

    telemetry : the host's telemetry work per step: publish, read, busy and gap maths, trace
                export (bench/harness/telemetry_cost.py; no GPU)
    sampler   : the always-on kernel sampler: decode throughput with it on against off,
                alternated pairs, per cost variant (bench/harness/sampler_cost.py; CUDA, a CPU
                run is a dry run: the sampler is off there)
    dashboard : an open Live page: engine throughput with and without headless Chromium on
                it, alternated phases (bench/harness/dashboard_cost.py; needs Chromium and
                playwright, and runs last: it serves app.py from this process)

By default the telemetry part, and the sampler part where the device is CUDA. What telemetry
costs on a whole GPU run is `python -m bench async-vs-sync --telemetry-cost` (the same run
with telemetry off).

    python -m bench watch-cost                                             # telemetry (+ sampler)
    python -m bench watch-cost --parts sampler --cost-period 1 --pair-new 768   # 8B b32, a GPU
    python -m bench watch-cost --parts sampler --device cpu --preset tiny --batch 4 \\
        --dtype float32 --pairs 1 --pair-new 8                                 # CPU dry run
    python -m bench watch-cost --parts dashboard --repeats 6 --pin-engine 0
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.harness import report
from bench.harness.dashboard_cost import add_dashboard_arguments, dashboard_cost
from bench.harness.sampler_cost import VARIANTS, add_cost_arguments, cost_markdown, cost_pairs
from bench.harness.telemetry_cost import add_telemetry_arguments, telemetry_costs
from bench.harness.truth_engine import add_shape_arguments

DESCRIPTION = ("what watching the engine costs: telemetry per step on the host, the kernel "
               "sampler, an open Live page")
PARTS = ("telemetry", "sampler", "dashboard")  # in the order they run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=None, type=parse_parts,
                        help=f"comma-separated, of: {', '.join(PARTS)} (default: telemetry, "
                        "and sampler on CUDA)")
    add_telemetry_arguments(parser.add_argument_group("telemetry part"))
    sampler = parser.add_argument_group("sampler part (one shape, random weights)")
    add_shape_arguments(sampler)
    add_cost_arguments(sampler)
    sampler.add_argument("--cost-variants", default="on",
                         help=f"comma-separated, of: {', '.join(VARIANTS)}")
    add_dashboard_arguments(parser.add_argument_group("dashboard part (the engine of "
                                                      "config.yaml)"))


def parse_parts(text: str) -> list[str]:
    """``--parts``: the parts named, in running order; an error naming the known ones."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    if not asked or any(p not in PARTS for p in asked):
        raise argparse.ArgumentTypeError(
            f"parts must be among {', '.join(PARTS)}, comma-separated; got {text!r}")
    return [p for p in PARTS if p in asked]


def parts_of(args: argparse.Namespace) -> list[str]:
    if args.parts is not None:
        return args.parts
    return ["telemetry", "sampler"] if args.device == "cuda" else ["telemetry"]


def sampler_part(args: argparse.Namespace, out: Path) -> dict:
    import torch

    from bench.harness.shapes import build_model
    from bench.harness.workload import random_prompts

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
    report.write_json(out / "sampler_cost.json", summary)
    (out / "sampler_cost.md").write_text(
        "\n\n".join("\n".join(cost_markdown(c)) for c in costs.values()) + "\n")
    return summary


def run(args: argparse.Namespace, out: Path) -> dict:
    summary: dict = {}
    for part in parts_of(args):
        print(f"\n## watch-cost: {part}", flush=True)
        if part == "telemetry":
            summary[part] = telemetry_costs(args.runs)
        elif part == "sampler":
            summary[part] = sampler_part(args, out)
        else:
            summary[part] = dashboard_cost(args)
    return summary
