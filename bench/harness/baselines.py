"""transformers' own continuous batching (`generate_batch`) on a suite's workload: the figure
gapless is compared against.

Same random-weight model shape, same prompts, greedy, a fixed number of new tokens, no EOS,
`paged|sdpa` attention, CUDA graphs, sync or async batching (on a CPU: no graphs, sync only,
a smoke run). Owns no engine code.
"""

from __future__ import annotations

import time

import torch

from bench.harness.timing import synchronize


def generate_batch(model: torch.nn.Module, prompts: list[list[int]], new: int,
                   use_async: bool) -> dict:
    """One timed `model.generate_batch` call: wall time, tokens, tokens/s, output lengths."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model.generation_config.eos_token_id = None
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1,
                           pad_token_id=0)
    cuda = model.device.type == "cuda"
    cb = ContinuousBatchingConfig(use_async_batching=use_async and cuda, use_cuda_graph=cuda,
                                  max_batch_tokens=2048)
    synchronize(model.device)
    t0 = time.perf_counter()
    outs = model.generate_batch(inputs=prompts, generation_config=gen,
                                continuous_batching_config=cb, max_new_tokens=new)
    synchronize(model.device)
    wall = time.perf_counter() - t0
    lengths = [len(o.generated_tokens) for o in outs.values()]
    return {"wall_s": wall, "tokens": sum(lengths), "tok_s": sum(lengths) / wall,
            "min_len": min(lengths), "max_len": max(lengths)}


def transformers_modes(model: torch.nn.Module, prompts: list[list[int]], new: int,
                       modes: list[str]) -> dict[str, dict]:
    """Warm up (4 prompts, 8 tokens), then one run per mode ('sync' or 'async')."""
    generate_batch(model, prompts[:4], 8, True)
    results = {}
    for mode in modes:
        results[mode] = generate_batch(model, prompts, new, mode == "async")
        print(f"transformers generate_batch {mode}: {results[mode]}", flush=True)
    return results
