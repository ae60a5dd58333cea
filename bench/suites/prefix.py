"""Prefix caching on a multi-turn chat workload, caching on against off.

--conversations chats share one --system-token system prompt; each has --turns turns. Turn k of
every chat is submitted at once; its prompt is the chat so far (system prompt, the earlier user
messages and replies) plus --user new tokens; replies are --new tokens, greedy, no EOS. The
same workload runs with prefix_caching off, then on (alternated --repeats times), each on a
fresh engine; with --interleave both engines live side by side and every turn runs off then
on, so a shared CPU's changing load falls on both alike (the CPU runs use it). Records wall
time (the turns' generate() time), output tokens/s, p50/p99 time to first token, and the hit
rate (prompt tokens found cached / prompt tokens looked up), and checks both give the same
tokens. --preset (random weights) or --model (a checkpoint folder, e.g. SmolLM2).

    python -m bench prefix --preset llama-8b                       # a GPU
    python -m bench prefix --model models/SmolLM2-135M-Instruct --device cpu --dtype float32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Generator
from pathlib import Path

import torch

from bench.harness.report import emit, markdown_table
from bench.harness.workload import add_model_arguments, model_from_args

DESCRIPTION = ("what prefix caching saves on multi-turn chats sharing a system prompt "
               "(throughput, TTFT, hits)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--model", default=None, help="checkpoint folder (instead of --preset)")
    parser.add_argument("--conversations", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=512)
    parser.add_argument("--user", type=int, default=32, help="new user tokens per turn")
    parser.add_argument("--new", type=int, default=64, help="reply tokens per turn")
    parser.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--interleave", action="store_true",
                        help="both engines side by side, turn k with caching off then on, so "
                             "other jobs' load on a shared CPU falls on both alike (two KV "
                             "caches at once: for the CPU)")


def make_engine(args: argparse.Namespace, model, caching: bool):
    from engine import Engine, EngineConfig

    max_len = args.system_tokens + args.turns * (args.user + args.new) + 16
    cfg = EngineConfig(
        model=args.model or f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.conversations, max_num_batched_tokens=args.budget,
        max_model_len=max_len, block_size=16, async_batching=True,
        cuda_graphs=args.device == "cuda", prefix_caching=caching)
    return Engine(cfg, model=model, tokenizer=None)


def chat_turns(eng, args: argparse.Namespace, vocab: int,
               label: str = "") -> Generator[None, None, dict]:
    """The workload on one engine, a turn per next(); returns the run's figures. Wall time
    is the sum of the turns' generate() times."""
    from engine import SamplingParams

    g = torch.Generator().manual_seed(0)
    system = torch.randint(1, vocab, (args.system_tokens,), generator=g).tolist()
    chats = [list(system) for _ in range(args.conversations)]
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    ttfts: list[float] = []
    tokens: list[list[int]] = []
    turn_s: list[float] = []
    load_start = os.getloadavg()[0]
    for turn in range(args.turns):
        for c in chats:
            c += torch.randint(1, vocab, (args.user,), generator=g).tolist()
        t_turn = time.perf_counter()
        outs = eng.generate([list(c) for c in chats], params)
        turn_s.append(time.perf_counter() - t_turn)
        # One line per turn: on a slow machine, how long the whole run will take, and how
        # loaded the machine was meanwhile (other jobs skew a CPU run's on/off ratio).
        print(f"  {label} turn {turn + 1}/{args.turns}: {turn_s[-1]:.1f} s, load average "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        for c, o in zip(chats, outs, strict=True):
            c += o.token_ids
            tokens.append(o.token_ids)
            ttfts.append(o.metrics["ttft_s"])
        yield
    wall = sum(turn_s)
    st = eng.stats()
    q, h = st["prefix_cache_queries"], st["prefix_cache_hits"]
    ttfts.sort()
    return {"wall_s": wall, "out_tok_s": sum(map(len, tokens)) / wall,
            "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "hit_rate": h / q if q else 0.0, "cached_tokens": h, "queried_tokens": q,
            "turn_s": turn_s, "loadavg_1min": [load_start, os.getloadavg()[0]],
            "tokens": tokens}


def run(args: argparse.Namespace, out: Path) -> dict:
    if args.model:
        model, vocab = None, _vocab(args.model)
    else:
        model = model_from_args(args)
        vocab = int(model.config.vocab_size)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    modes = (("off", "on"),) if args.interleave else (("off",), ("on",))
    for _ in range(args.repeats):
        for together in modes:  # engines alive at once; their turns alternate
            engines: dict[str, object] = {}
            try:
                for name in together:
                    engines[name] = make_engine(args, model, name == "on")
                turns = {name: chat_turns(eng, args, vocab, f"caching {name}")
                         for name, eng in engines.items()}
                while turns:
                    for name in list(turns):
                        try:
                            next(turns[name])
                        except StopIteration as done:
                            runs[name].append(done.value)
                            del turns[name]
            finally:
                for eng in engines.values():
                    eng.shutdown()
    same = runs["off"][0]["tokens"] == runs["on"][0]["tokens"]
    rows, summary = [], {}
    for name, rs in runs.items():
        best = min(rs, key=lambda r: r["wall_s"])
        summary[name] = {k: v for k, v in best.items() if k != "tokens"}
        rows.append([name, f"{best['wall_s']:.2f}", f"{best['out_tok_s']:.0f}",
                     f"{best['ttft_p50_ms']:.0f}", f"{best['ttft_p99_ms']:.0f}",
                     f"{100 * best['hit_rate']:.1f}%"])
    speedup = summary["off"]["wall_s"] / summary["on"]["wall_s"]
    shape = args.model or args.preset
    title = (f"prefix caching, {shape}, {args.conversations} chats x {args.turns} turns, "
             f"system {args.system_tokens} + {args.user}/turn, {args.new} new, {args.device}")
    table = markdown_table(["caching", "wall s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
                            "hit rate"], rows)
    notes = (f"speedup on/off {speedup:.2f}x; greedy tokens identical on/off: {same}; "
             "1-minute load average at start/end of each best run: "
             + ", ".join(f"{n} {summary[n]['loadavg_1min'][0]:.1f}/"
                         f"{summary[n]['loadavg_1min'][1]:.1f}" for n in summary))
    data = {"args": {k: v for k, v in vars(args).items() if not callable(v)},
            "summary": summary, "speedup": speedup, "identical_tokens": same}
    emit(out, f"prefix-{Path(shape).name}", title, [table, notes], data)
    return data


def _vocab(model_dir: str) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    return int(getattr(cfg, "vocab_size", None) or cfg.get_text_config().vocab_size)
