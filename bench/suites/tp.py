"""Tensor parallelism: the 8B shape, 32 x (256 + 1024), at TP 1 and TP 2, per-GPU figures.

Writes a random-weight checkpoint of the shape once (each rank loads its shard from disk, so the
model must be a folder), then for each tensor_parallel_size runs the workload (greedy, no EOS,
async + CUDA graphs) and prints one table: wall time, tokens/s, and per GPU the step-busy
fraction (rank 0's compute lane, rankN.compute for the others), the share of the run inside
collectives (rankN.comm), and the mean NVML GPM memory bandwidth used (DRAM_BW_UTIL, where the
GPU reports it). Greedy tokens at TP 2 are checked against TP 1 (agreement printed; bf16
summation order differs, so rare late divergence is possible and reported, not asserted).

    python -m bench tp                       # 2 GPUs: --preset llama-8b --tp 1 2
    python -m bench tp --preset tiny --device cpu --n 4 --prompt 16 --new 16  # smoke

Written for the lent 2-GPU machine; not run yet (no GPU where it was written).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from bench.harness import report
from bench.harness.shapes import build_model
from engine import Engine, EngineConfig, SamplingParams
from telemetry.collect import StepCollector
from telemetry.metrics import busy_fraction, spans_of
from telemetry.records import rank_lane

DESCRIPTION = ("what tensor parallelism 2 buys at the 8B shape: whole run, per-GPU busy, "
               "collectives (2 GPUs)")


def save_checkpoint(preset: str, folder: Path) -> Path:
    """The preset's random bf16 weights and a small byte-level tokenizer, save_pretrained."""
    if (folder / "config.json").exists():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    model = build_model(preset, torch.device("cpu"), torch.bfloat16)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x + 1\n"] * 8, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(
        folder)
    return folder


class GpmPoll:
    """Mean DRAM_BW_UTIL per GPU over the run (NVML GPM; None where not reported)."""

    def __init__(self, gpus: int, interval_s: float = 0.25) -> None:
        from telemetry.nvml import NvmlSampler

        self.samplers = [NvmlSampler(interval_s=interval_s, device_index=i) for i in range(gpus)]

    def __enter__(self) -> GpmPoll:
        for s in self.samplers:
            if s.available:
                s.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.samplers:
            s.stop()

    def mean_bw_pct(self) -> list[float | None]:
        out = []
        for s in self.samplers:
            vals = [r.dram_bw_util_pct for r in s.history() if r.dram_bw_util_pct is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        return out


def run_tp(folder: Path, tp: int, args: argparse.Namespace) -> dict:
    cfg = EngineConfig(model=str(folder), device=args.device, tensor_parallel_size=tp,
                       max_num_seqs=args.n, max_num_batched_tokens=args.budget,
                       max_model_len=args.prompt + args.new + 16, async_batching=True,
                       cuda_graphs=True, telemetry=True)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 250, (args.prompt,), generator=g).tolist() for _ in range(args.n)]
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    gpus = tp if args.device == "cuda" else 0
    with Engine(cfg) as eng:
        eng.generate(prompts[:2], SamplingParams(max_tokens=4, detokenize=False))  # warm-up
        with StepCollector(eng.bus) as collector, GpmPoll(gpus) as gpm:
            t0 = time.perf_counter()
            outs = eng.generate(prompts, params)
            wall = time.perf_counter() - t0
    spans = spans_of(collector.records)
    start, end = min(s.start_ns for s in spans), max(s.end_ns for s in spans)
    lanes = ["compute"] + [rank_lane(r, "compute") for r in range(1, tp)]
    res = {
        "tp": tp, "wall_s": wall, "tok_s": args.n * args.new / wall,
        "busy": [busy_fraction(spans, start, end, lane=lane) for lane in lanes],
        "comm": [busy_fraction(spans, start, end, lane=rank_lane(r, "comm")) if tp > 1 else 0.0
                 for r in range(tp)],
        "dram_bw_pct": gpm.mean_bw_pct() if gpus else [None] * tp,
        "outputs": [o.token_ids for o in outs],
    }
    return res



def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--preset", default="llama-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=1024)
    ap.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    ap.add_argument("--folder", default=None, help="checkpoint folder (default: a temp dir)")


def run(args: argparse.Namespace, out: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="gapless-tp-") as tmp:
        folder = save_checkpoint(args.preset, Path(args.folder or tmp))
        results = [run_tp(folder, tp, args) for tp in args.tp]
    base = results[0]["outputs"]
    print(f"{args.preset}: {args.n} x ({args.prompt} + {args.new}), async + graphs, "
          f"{args.device}")
    print(f"{'TP':>3} {'wall s':>8} {'tok/s':>8}  per GPU: step busy / in collectives / DRAM bw")
    for r in results:
        same = sum(a == b for a, b in zip(r["outputs"], base, strict=True))
        gpus = "  ".join(
            f"gpu{i} {b:.1%} / {c:.1%} / {'n/a' if w is None else f'{w:.0f}%'}"
            for i, (b, c, w) in enumerate(zip(r["busy"], r["comm"], r["dram_bw_pct"],
                                              strict=True)))
        print(f"{r['tp']:>3} {r['wall_s']:>8.2f} {r['tok_s']:>8.0f}  {gpus}  "
              f"(outputs equal to TP {results[0]['tp']}: {same}/{len(base)})")
    rows = [{k: v for k, v in r.items() if k != "outputs"} for r in results]
    report.write_json(out / "tp.json", {"meta": report.meta(), "results": rows})
    return {"results": rows}
