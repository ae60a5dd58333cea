"""The truth suites' engine plumbing (bench/suites/truth*.py): the options of one shape, an
engine for one shape and batch, greedy sampling parameters, and waiting until a fresh batch
decodes."""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from bench.harness.workload import default_device


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """One shape's engine on its device (watch-cost's sampler part)."""
    parser.add_argument("--preset", default="llama-8b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default=default_device())
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--budget", type=int, default=2048)


def make_engine(model: torch.nn.Module, args: argparse.Namespace, batch: int, max_new: int,
                period: float = 0.0, name: str = "shape"):
    from engine import Engine, EngineConfig

    cuda = args.device == "cuda"
    max_len = args.prompt + max_new + 32
    cfg = EngineConfig(
        model=f"random:{name}", device=args.device, dtype=args.dtype, max_num_seqs=batch,
        max_num_batched_tokens=max(args.budget, batch), max_model_len=max_len, block_size=16,
        num_blocks=batch * -(-max_len // 16) + 16, async_batching=True, num_slots=2,
        cuda_graphs=cuda, graph_buckets=[8, 16, batch] if cuda and batch > 16 else (
            [batch] if cuda else None), kernel_sample_period_s=period,
    )
    return Engine(cfg, model=model, tokenizer=None)


def params(n: int):
    from engine import SamplingParams

    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)


def wait_decoding(eng: Any, batch: int, timeout_s: float = 180.0) -> None:
    """Until every request of a fresh batch has its first token (prefill done)."""
    start = eng.stats()["generated_tokens"]
    deadline = time.monotonic() + timeout_s
    while eng.stats()["generated_tokens"] < start + 2 * batch:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the batch did not start decoding within {timeout_s:g} s")
        time.sleep(0.002)
