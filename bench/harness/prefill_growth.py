"""Prefill time against prompt length, and the largest token gap of a stream beside a long
prefill: the `prefill` part of `python -m bench default-model` (the attention path must not
copy the whole context per prompt token, and chunked prefill must keep streams flowing).

Runs the engine in this process (on the CPU by default). Two measurements:

    prefill : one request alone, a prompt of L token ids, one new token; the time to its first
              token (median of --prefill-repeats), for each L in --lengths (capped at
              max_model_len - 1)
    gap     : a stream (short prompt, greedy, no EOS) runs; once it has produced --warm tokens a
              prompt of the longest length is submitted beside it. The stream's largest gap
              between two deltas while that prompt prefills, against its median gap before (one
              step's time): with chunked prefill the gap is a few step times, not the prefill

The engine config is built from explicit keys only (no config.yaml where --model names the
model), so the same part runs against an older source tree (`python -m bench ab default-model
--trees BEFORE,AFTER -- --parts prefill --model models/gapless-tiny-python`).

    python -m bench default-model --parts prefill --model models/gapless-tiny-python \\
        [--lengths 128 256 512 1024] [--prefill-repeats 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import threading
import time
from pathlib import Path

from bench.harness import report
from engine import Engine, EngineConfig, SamplingParams


def add_prefill_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024],
                    help="prompt lengths, each capped at max_model_len - 1")
    ap.add_argument("--prefill-repeats", type=int, default=2,
                    help="runs per length (median)")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--warm", type=int, default=16,
                    help="stream tokens before the long prompt is submitted")


def prompt_ids(length: int, vocab: int, salt: int) -> list[int]:
    """A deterministic prompt of ``length`` ids (distinct per salt: no prefix-cache hits)."""
    return [1 + (i * 7919 + salt * 104729) % (vocab - 2) for i in range(length)]


def prefill_s(eng: Engine, length: int, vocab: int, salt: int) -> float:
    out = eng.generate([prompt_ids(length, vocab, salt)],
                       SamplingParams(max_tokens=1, temperature=0.0))[0]
    return float(out.metrics["ttft_s"])


def stream_gap(eng: Engine, length: int, vocab: int, warm: int) -> dict[str, float]:
    """The stream's median gap before the long prompt and its largest gap while it ran."""
    times: list[float] = []
    started = threading.Event()
    done = threading.Event()

    def on_delta(rid: str, text: str) -> None:
        times.append(time.perf_counter())
        if len(times) >= warm:
            started.set()

    rid = eng.submit(prompt_ids(8, vocab, 999), SamplingParams(
        max_tokens=eng.config.max_model_len - 16, temperature=0.0, ignore_eos=True),
        on_delta=on_delta).request_id
    if not started.wait(300):
        raise RuntimeError("the stream produced no tokens in 300 s")
    before = list(times)
    t_submit = time.perf_counter()
    eng.submit(prompt_ids(length, vocab, 1000), SamplingParams(max_tokens=1, temperature=0.0),
               on_finish=lambda out: done.set())
    if not done.wait(600):
        raise RuntimeError("the long prompt did not finish in 600 s")
    t_done = time.perf_counter()
    n = len(times)
    deadline = time.monotonic() + 60
    while len(times) < n + 3 and time.monotonic() < deadline:  # a few tokens after it
        time.sleep(0.01)
    eng.abort(rid)
    during = [t for t in times if t >= t_submit]
    gaps = [b - a for a, b in zip([before[-1], *during[:-1]], during, strict=True)]
    step = statistics.median(b - a for a, b in zip(before[1:], before[2:], strict=False))
    return {"step_s": step, "largest_gap_s": max(gaps) if gaps else float("nan"),
            "prefill_wall_s": t_done - t_submit, "tokens_during": len(during)}


def prefill_growth(args: argparse.Namespace, model: str, out: Path) -> dict:
    """Both measurements with ``model`` on ``args.device``; writes prefill.md/.json."""
    keys = {"model": model, "device": args.device, "max_model_len": args.max_model_len,
            "max_num_batched_tokens": args.max_num_batched_tokens, "async_batching": True}
    if "prefix_caching" in {f.name for f in dataclasses.fields(EngineConfig)}:
        keys["prefix_caching"] = False  # an older tree has no such key
    cfg = EngineConfig.from_dict(keys)
    lengths = [min(n, args.max_model_len - 1) for n in args.lengths]
    rows: list[dict] = []
    with Engine(cfg) as eng:
        vocab = len(eng.tokenizer)
        eng.generate([prompt_ids(32, vocab, 0)], SamplingParams(max_tokens=4))  # warm-up
        for length in lengths:
            times = [prefill_s(eng, length, vocab, 10 * length + r)
                     for r in range(args.prefill_repeats)]
            rows.append({"prompt_tokens": length, "prefill_s": statistics.median(times),
                         "runs": times})
            print(f"prefill {length} tokens: {statistics.median(times):.3f} s", flush=True)
        gap = stream_gap(eng, max(lengths), vocab, args.warm)
    table = report.markdown_table(
        ["prompt tokens", "prefill (time to first token) s"],
        [[r["prompt_tokens"], f"{r['prefill_s']:.3f}"] for r in rows])
    gap_line = (f"Stream beside a {max(lengths)}-token prefill: largest gap "
                f"{gap['largest_gap_s']:.3f} s, median step {gap['step_s'] * 1000:.1f} ms "
                f"({gap['largest_gap_s'] / gap['step_s']:.1f} steps), the prefill took "
                f"{gap['prefill_wall_s']:.2f} s beside it, {gap['tokens_during']} stream "
                f"tokens meanwhile.")
    note = (f"Model {Path(model).name}, {args.device}, async, max_num_batched_tokens "
            f"{args.max_num_batched_tokens}, prefix caching off, median of "
            f"{args.prefill_repeats}.")
    summary = {"model": Path(model).name, "device": args.device, "rows": rows, "gap": gap,
               "max_num_batched_tokens": args.max_num_batched_tokens}
    report.emit(out, "prefill", "Prefill vs prompt length", [table, gap_line, note], summary)
    return summary
