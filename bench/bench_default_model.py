"""Tokens/s of the shipped default model through the engine on this machine (issue 6).

Batch 1 and batch 16, greedy, 64 new tokens per request, no EOS, in async mode (the
default) and sync mode. Usage: .venv/bin/python bench/bench_default_model.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402

PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:", "    for i in range(",
           "def read_config(path):", "try:\n    import json\nexcept", "if __name__ ==",
           "    return self."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True)
    print("| mode | batch | tok/s (median of runs) | per-request decode tok/s |")
    print("|---|---:|---:|---:|")
    for mode in ("async", "sync"):
        cfg = EngineConfig.from_yaml(ROOT / "config.yaml", device="cpu",
                                     async_batching=mode == "async")
        with Engine(cfg) as eng:
            eng.generate(PROMPTS[:2], SamplingParams(max_tokens=8))  # warm-up
            for batch in (1, 16):
                prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
                rates, per_req = [], []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    outs = eng.generate(prompts, params)
                    wall = time.perf_counter() - t
                    rates.append(sum(len(o.token_ids) for o in outs) / wall)
                    per_req.append(statistics.median(o.metrics["decode_tokens_per_s"]
                                                     for o in outs))
                print(f"| {mode} | {batch} | {statistics.median(rates):.0f} | "
                      f"{statistics.median(per_req):.1f} |", flush=True)


if __name__ == "__main__":
    main()
