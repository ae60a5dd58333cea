"""Workloads every suite builds the same way: random prompts from a seed, and the model options
(--preset, --device, --dtype) with the random-weight model they describe.

Owns prompt generation and model construction for benchmarks; never times or prints anything.
"""

from __future__ import annotations

import argparse

import torch

from bench.harness.shapes import PRESETS, build_model


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def add_model_arguments(parser: argparse.ArgumentParser, preset: str = "llama-8b") -> None:
    """--preset (a random-weight model shape), --device and --dtype."""
    parser.add_argument("--preset", default=preset, choices=sorted(PRESETS),
                        help="model shape with random weights (default %(default)s)")
    parser.add_argument("--device", default=default_device(), help="cuda or cpu")
    parser.add_argument("--dtype", default="bfloat16")


def model_from_args(args: argparse.Namespace) -> torch.nn.Module:
    return build_model(args.preset, torch.device(args.device), getattr(torch, args.dtype))


def random_prompts(n: int, prompt: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `prompt` token ids drawn uniformly from [1, vocab) with a fixed seed: the
    workload of every decode benchmark (seed 0 is the measured one, seed 1 the warm-up)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (prompt,), generator=g).tolist() for _ in range(n)]


def int_list(text: str) -> list[int]:
    """'32,1' -> [32, 1] (argparse type for comma-separated sizes)."""
    return [int(x) for x in text.split(",") if x.strip()]
