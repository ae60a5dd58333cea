"""What the kernel sampler costs: decode throughput with the sampler on at ``--cost-period``
against off, in alternated pairs (bench.harness.timing), two engines on one model so both stay
warm. Cost is linear in the sampling rate (each sample costs the same profiler start, stop and
conversion), so a cost measured at a period shorter than the engine's default bounds the
default's from above. watch-cost's sampler part runs it alone; the truth suite on its first
shape.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch


def add_cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=3, help="sampler on/off pairs")
    parser.add_argument("--pair-new", type=int, default=384, help="new tokens per pair run")
    parser.add_argument("--cost-period", type=float, default=2.0,
                        help="sampler period of the cost pairs")


VARIANTS = {
    "on": "the sampler as shipped",
    "no-convert": "profiler sessions and brackets, results dropped unconverted",
    "switch-5ms": "conversion under Python's default 5 ms GIL switch interval",
}


def cost_pairs(model: torch.nn.Module, prompts: list[list[int]],
               args: argparse.Namespace, variant: str = "on") -> dict[str, Any]:
    """Throughput with the sampler at --cost-period vs off, alternated. ``variant`` takes
    the cost apart (VARIANTS): the profiler sessions alone, or the conversion's GIL share."""
    from bench.harness.timing import alternated_pairs
    from bench.harness.truth_engine import make_engine, params
    from engine.instruments import kernel_sampler

    if variant not in VARIANTS:
        raise ValueError(f"cost variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    period = getattr(args, "cost_period", 2.0)
    on = make_engine(model, args, len(prompts), args.pair_new, period=period)
    off = make_engine(model, args, len(prompts), args.pair_new, period=0.0)
    on.instruments.kernels.keep_results = variant != "no-convert"
    switch = kernel_sampler.CONVERT_SWITCH_S
    if variant == "switch-5ms":
        kernel_sampler.CONVERT_SWITCH_S = None
    try:
        for e in (on, off):  # the whole batch: its first decode steps capture its graphs,
            e.generate(prompts, params(8))  # which the first timed run must not pay

        def run(e: Any) -> float:
            t = time.perf_counter()
            e.generate(prompts, params(args.pair_new))
            return len(prompts) * args.pair_new / (time.perf_counter() - t)

        res = alternated_pairs(lambda: run(off), lambda: run(on), args.pairs)
        samples = on.instruments.kernels.samples_made
        convert = [round(x * 1e3, 2) for x in on.instruments.kernels.convert_s]
    finally:
        kernel_sampler.CONVERT_SWITCH_S = switch
        on.shutdown()
        off.shutdown()
    pairs = [{"off_tok_s": a, "on_tok_s": b, "cost_pct": 100 * (1 - b / a)}
             for a, b in zip(res.a.values, res.b.values, strict=True)]
    return {"pairs": pairs, "median_cost_pct": statistics.median(p["cost_pct"] for p in pairs),
            "samples_made": samples, "period_s": period, "convert_ms": convert,
            "variant": variant, "read_from_objects": kernel_sampler.READ_OBJECTS,
            "read_times_s": dict(kernel_sampler.READ_TIMES)}


def cost_markdown(c: dict[str, Any]) -> list[str]:
    conv = c.get("convert_ms") or []
    what = VARIANTS.get(c.get("variant", "on"), "")
    return [f"## Sampler cost ({c.get('period_s', 2.0):g} s period vs off, tok/s, alternated; "
            f"{what})",
            "", ", ".join(f"{p['on_tok_s']:.0f} vs {p['off_tok_s']:.0f} "
                          f"({p['cost_pct']:+.2f}%)" for p in c["pairs"])
            + f"; median {c['median_cost_pct']:+.2f}%; {c['samples_made']} samples"
            + (f"; conversion {statistics.median(conv):.1f} ms median (worker thread)"
               if conv else "")]
