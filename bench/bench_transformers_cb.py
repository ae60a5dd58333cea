"""transformers' own continuous batching (`generate_batch`) on bench_async.py's workload.

The figure gapless is compared against (issue 11): the same random-weight model shape, the
same prompts (bench_async.workload, seed 0), greedy, a fixed number of new tokens, no EOS,
`paged|sdpa` attention, CUDA graphs, sync or async batching. Prints wall time and tokens/s
per mode and writes $OUT/bench_transformers_cb.json when OUT is set.

    python bench/bench_transformers_cb.py --preset llama-8b --requests 32 --prompt 256 --new 1024
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

from bench_async import workload  # noqa: E402
from model_shapes import build_model  # noqa: E402


def run(model: torch.nn.Module, prompts: list[list[int]], new: int, use_async: bool) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    cb = ContinuousBatchingConfig(use_async_batching=use_async, use_cuda_graph=True,
                                  max_batch_tokens=2048)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=prompts, generation_config=gen,
                                continuous_batching_config=cb, max_new_tokens=new)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    lengths = [len(o.generated_tokens) for o in outs.values()]
    return {"wall_s": wall, "tokens": sum(lengths), "tok_s": sum(lengths) / wall,
            "min_len": min(lengths), "max_len": max(lengths)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama-8b")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--modes", default="async", help="comma-separated: sync, async")
    args = ap.parse_args()
    model = build_model(args.preset, torch.device("cuda"), torch.bfloat16)
    model.generation_config.eos_token_id = None
    prompts = workload(args.requests, args.prompt, model.config.vocab_size)
    run(model, prompts[:4], 8, True)  # warm-up
    results = {}
    for mode in args.modes.split(","):
        res = run(model, prompts, args.new, mode == "async")
        results[mode] = res
        print(f"transformers generate_batch {mode}: {json.dumps(res)}", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_transformers_cb.json").write_text(
            json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
