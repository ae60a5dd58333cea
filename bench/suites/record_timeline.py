"""Record the engine's timeline in each mode to a JSON-lines file the dashboard opens.

Runs one fixed workload (random-weight model of a named shape, greedy, EOS ignored) once per
mode on one in-process engine and writes telemetry/export.py's JSON lines: a first
``{"type": "meta"}`` line (machine, date, commit, model shape, workload, and which steps
belong to which mode), then every step record and request event. Open it on the dashboard's
Recordings page (or A/B): a user with no GPU sees what each mode does on the machine it was
recorded on. Imports no UI code (the GPU machine has no streamlit).

    # on a GPU: an 8B and a 1B shape, sync and async, CUDA graphs on
    python -m bench record-timeline --preset llama-8b --file docs/recordings/h200-llama-8b.jsonl
    python -m bench record-timeline --preset llama-1b --file docs/recordings/h200-llama-1b.jsonl
    # on a CPU (the test fixture)
    python -m bench record-timeline --preset tiny --device cpu --dtype float32 \
        --requests 4 --prompt 16 --new 24 --budget 64 --file docs/recordings/cpu-tiny.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from bench.harness.report import short_commit
from bench.harness.shapes import PRESETS, build_model
from engine import Engine, EngineConfig, SamplingParams
from telemetry.export import record_to_dict

DESCRIPTION = ("records each mode's timeline for the dashboard's Recordings page (a fixture, "
               "not a figure)")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--preset", default="llama-8b", choices=sorted(PRESETS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--modes", default="sync,async", help="comma-separated: sync, async")
    ap.add_argument("--graphs", choices=("on", "off"), default="on",
                    help="CUDA graphs where available (always off on a CPU)")
    ap.add_argument("--machine", default=None, help="label; default: the GPU's or CPU's name")
    ap.add_argument("--file", default=None,
                    help="the recording (default: <out>/<preset>.jsonl)")


def run(args: argparse.Namespace, out: Path) -> dict:

    device = torch.device(args.device)
    model = build_model(args.preset, device, getattr(torch, args.dtype))
    cfg = EngineConfig(
        model=f"random:{args.preset}", device=args.device, dtype=args.dtype,
        max_num_seqs=args.requests, max_num_batched_tokens=args.budget,
        max_model_len=args.prompt + args.new + 16, block_size=16, async_batching=True,
        num_slots=2, cuda_graphs=False, telemetry=True)
    eng = Engine(cfg, model=model, tokenizer=None)
    graphs = args.graphs == "on" and bool(eng.settings()["cuda_graphs_available"])
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(1, vocab, (args.prompt,), generator=g).tolist()
               for _ in range(args.requests)]
    params = SamplingParams(max_tokens=args.new, temperature=0.0, ignore_eos=True,
                            detokenize=False)
    eng.configure(cuda_graphs=graphs)
    eng.generate([p[:8] for p in prompts[:4]], SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False))  # warm-up
    items, windows = [], []
    for mode in args.modes.split(","):
        if mode not in ("sync", "async"):
            raise SystemExit(f"--modes takes sync and/or async, got {mode!r}")
        eng.configure(async_batching=mode == "async")
        reader = eng.bus.reader(from_now=True)
        t0 = time.perf_counter()
        eng.generate(prompts, params)
        wall = time.perf_counter() - t0
        steps, events = reader.steps(), reader.events()
        label = mode + ("+graphs" if graphs else "")
        windows.append({"label": label, "first_step": steps[0].step, "last_step": steps[-1].step,
                        "wall_s": round(wall, 4), "steps": len(steps)})
        items += steps + events
        print(f"{label}: {len(steps)} steps, {wall:.3f} s", flush=True)
    eng.shutdown()
    machine = args.machine or (torch.cuda.get_device_name() if device.type == "cuda"
                               else f"CPU ({platform.processor() or platform.machine()})")
    meta = {
        "type": "meta", "machine": machine, "date": time.strftime("%Y-%m-%d"),
        "commit": short_commit(), "model": f"{args.preset} shape, random {args.dtype} weights",
        "workload": f"{args.requests} x ({args.prompt} prompt + {args.new} new tokens), greedy",
        "graphs": graphs, "windows": windows, "torch": torch.__version__,
    }
    path = Path(args.file) if args.file else out / f"{args.preset}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(meta) + "\n")
        for it in items:
            f.write(json.dumps(record_to_dict(it), separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return {"file": str(path), "windows": windows, "graphs": graphs}
