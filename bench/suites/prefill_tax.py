"""The prefill tax on a real engine: a long prompt arrives beside 8 running streams.

Runs one in-process engine (sync, chunked prefill) with 8 streams decoding throughout. After
a warm-up prefill, each round prefills a prompt as long as the long prompt (its twin: the fit
sees chunks like the long prompt's, as a live window that has seen prefills does) and the long
prompt, the long one second in even rounds and first in odd ones, each chunked at the budget
minus the 8 decode tokens. The step-time fit (telemetry/prefill_tax.py) is made over the same
run's steps after the warm-up *without* the long prompt's chunk steps, and predicts those: the
streams' measured inter-token latency during the long prompt's chunks (from their token
events) against the fit's prediction with its 95% interval for the mean of those steps. A fit
of the decode-only steps (what a step time measured between prefills says) is the control that
must miss.

    python -m bench prefill-tax --file docs/recordings/cpu-prefill-tax.jsonl

writes the run as a recording for the dashboard's Recordings page (the telemetry/export.py
JSON lines behind a meta line) and prints the table docs/benchmarks.md quotes. The scenario
is importable (run_scenario, penalty_check) for the engine test, which writes no file. It
imports no UI code.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bench.harness.report import short_commit
from engine import Engine, EngineConfig, SamplingParams
from telemetry.export import record_to_dict
from telemetry.prefill_tax import TERMS, NoFit, Term, fit_step_time, timed_steps
from telemetry.records import RequestEvent, StepRecord

DESCRIPTION = ("the ITL penalty a long prompt's chunked prefill puts on 8 running streams, "
               "measured against the step-time fit's prediction (CPU)")
DEFAULT_MODEL = "models/gapless-tiny-python"
STREAMS = 8
CHUNK = 256  # prefill tokens a step beside the 8 decodes: the budget is CHUNK + STREAMS
FIT_PROMPTS = (1000,)  # a twin of the long prompt, beside it in time
LONG_PROMPT = 1000
ROUNDS = 6
SETTLE_STEPS = 3  # decode-only steps after each prompt


@dataclass(slots=True)
class ScenarioRun:
    """What the scenario recorded, and which requests were the long prompt and the streams."""

    records: list[StepRecord]
    events: list[RequestEvent]
    long_ids: set[str]
    stream_ids: set[str]
    first_step: int  # the first step after the warm-up: the check's window starts here
    meta: dict = field(default_factory=dict)


def run_scenario(model: str = DEFAULT_MODEL, *, rounds: int = ROUNDS,
                 long_prompt: int = LONG_PROMPT, fit_prompts: Sequence[int] = FIT_PROMPTS,
                 chunk: int = CHUNK, threads: int = 1, seed: int = 0) -> ScenarioRun:
    """Run the scenario on a CPU engine driven step by step (float32, sync). ``threads`` torch
    threads while it runs (the previous number is put back): one keeps a shared machine's
    cores from fighting over one step."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)
    cfg = EngineConfig(model=model, device="cpu", dtype="float32", async_batching=False,
                       max_num_seqs=STREAMS + 2, max_num_batched_tokens=chunk + STREAMS,
                       max_model_len=1024, block_size=16)
    steps_needed = rounds * (sum(-(-p // chunk) for p in (*fit_prompts, long_prompt))
                             + SETTLE_STEPS * (len(fit_prompts) + 1)) + 2 * SETTLE_STEPS

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(10, 8000, n)]

    try:
        with Engine(cfg, start=False) as eng:
            stream_params = SamplingParams(max_tokens=steps_needed + 8, temperature=0.0,
                                           ignore_eos=True, detokenize=False)
            one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                                 detokenize=False)
            streams = [eng.submit(prompt(40 + 5 * i), stream_params) for i in range(STREAMS)]
            # a first long prefill touches the KV cache's memory and each shape once: warm-up,
            # recorded, and left out of the check (penalty_check starts after it)
            warm = eng.submit(prompt(long_prompt), one)
            while not warm.done:
                eng.step()
            for _ in range(2 * SETTLE_STEPS):
                eng.step()
            first_step = eng.bus.snapshot_steps(1)[-1].step + 1
            long_ids = set()
            for r in range(rounds):
                # the long prompt last in even rounds and first in odd ones: whatever a prompt
                # leaves to the next (warm memory, a slow stretch) falls on both sides
                order = [(n, False) for n in fit_prompts] + [(long_prompt, True)]
                for n, is_long in (order if r % 2 == 0 else order[::-1]):
                    h = eng.submit(prompt(n), one)
                    if is_long:
                        long_ids.add(h.request_id)
                    while not h.done:
                        eng.step()
                    for _ in range(SETTLE_STEPS):
                        eng.step()
            for s in streams:
                eng.abort(s.request_id)
            while eng.step():
                pass
            records = eng.bus.snapshot_steps(100_000)
            events = eng.bus.snapshot_events(1_000_000)
    finally:
        torch.set_num_threads(prev_threads)
    return ScenarioRun(records, events, long_ids, {s.request_id for s in streams}, first_step,
                       meta={"model": model, "streams": STREAMS, "budget": chunk + STREAMS,
                             "fit_prompts": list(fit_prompts), "long_prompt": long_prompt,
                             "rounds": rounds, "threads": threads})


@dataclass(slots=True, frozen=True)
class PenaltyCheck:
    """The long prompt's chunk steps: the streams' measured ITL against the fit's prediction
    (ms). Per step: how many of the ``chunk_steps`` lie inside their own 95% prediction interval
    (``inside``). Over them: the mean measured ITL (outliers included, as the band's spread
    includes them) against the fit's mean with its 95% interval; ``baseline_ms`` is the fit's
    time of the same steps without their chunk, so the penalties are each ITL minus it."""

    chunk_steps: int
    inside: int
    measured_itl_ms: float
    predicted_itl_ms: float
    lo_ms: float
    hi_ms: float
    baseline_ms: float
    fit_steps: int
    rmse_ms: float
    terms: tuple[str, ...]
    outliers: int = 0  # chunk steps that are outliers by the fit's rule
    fit_outliers: int = 0  # steps the fit itself left out

    @property
    def measured_penalty_ms(self) -> float:
        return self.measured_itl_ms - self.baseline_ms

    @property
    def predicted_penalty_ms(self) -> float:
        return self.predicted_itl_ms - self.baseline_ms

    @property
    def error_ms(self) -> float:
        return (self.hi_ms - self.lo_ms) / 2

    @property
    def mean_holds(self) -> bool:
        """The mean measured ITL lies in the interval of the mean of those steps."""
        return self.lo_ms <= self.measured_itl_ms <= self.hi_ms

    @property
    def holds(self) -> bool:
        """At least two thirds of the chunk steps lie inside their own 95% prediction intervals
        (a 95% interval leaves one in twenty out, and a shared machine's slow stretches take
        neighbours out together). Step by step, as the band is a step's: the mean of a few
        steps that hold an outlier of twice their time is the outlier's more than the model's."""
        return self.inside * 3 >= self.chunk_steps * 2


def stream_itl_at_steps(records: Sequence[StepRecord], events: Sequence[RequestEvent],
                        stream_ids: set[str]) -> dict[int, list[float]]:
    """Per step, the streams' ITL samples (ms) of the tokens that step delivered: a token
    event belongs to the step whose cpu.post span holds it (tokens are delivered there)."""
    posts = sorted((s.start_ns, s.end_ns, r.step) for r in records for s in r.spans
                   if s.lane == "cpu.post")
    starts = np.array([p[0] for p in posts], dtype=np.int64)
    last: dict[str, int] = {}
    out: dict[int, list[float]] = {}
    for ev in sorted(events, key=lambda e: e.t_ns):
        if ev.request_id not in stream_ids or ev.kind not in ("first_token", "tokens"):
            continue
        prev = last.get(ev.request_id)
        last[ev.request_id] = ev.t_ns
        if prev is None:
            continue
        i = int(np.searchsorted(starts, ev.t_ns, side="right")) - 1
        if i >= 0 and posts[i][0] <= ev.t_ns <= posts[i][1]:
            out.setdefault(posts[i][2], []).append((ev.t_ns - prev) / 1e6)
    return out


def penalty_check(run: ScenarioRun, terms: Sequence[Term] = TERMS,
                  decode_only: bool = False) -> PenaltyCheck:
    """Fit on the run's steps without the long prompt's chunks; predict those steps. With
    ``decode_only`` the fit sees only the steps without a prefill chunk (the control: what a
    step time measured between prefills says)."""
    long_steps = {r.step for r in run.records
                  if any(c[0] in run.long_ids and c[1] > 1 for c in r.chunks)}
    fit_recs = [r for r in run.records if r.step >= run.first_step and r.step not in long_steps
                and not (decode_only and r.prefill_tokens > 0)]
    fit = fit_step_time(fit_recs, window_steps=len(run.records), terms=terms)
    if isinstance(fit, NoFit):
        raise RuntimeError(f"the scenario's fit failed: {fit.reason}")
    itl = stream_itl_at_steps(run.records, run.events, run.stream_ids)
    chunk_steps = [s for s in timed_steps(run.records) if s.step in long_steps and s.step in itl]
    if not chunk_steps:
        raise RuntimeError("no chunk step of the long prompt carried a stream's token")
    inside = 0
    for s in chunk_steps:
        one = fit.predict(s.decode_tokens, s.prefill_tokens, s.context)
        inside += one.lo_ns <= float(np.mean(itl[s.step])) * 1e6 <= one.hi_ns
    slow = sum(1 for s in chunk_steps if fit.is_outlier(
        float(np.mean(itl[s.step])) * 1e6, fit.mean_ns(s.decode_tokens, s.prefill_tokens,
                                                       s.context)))
    pred = fit.predict_steps(chunk_steps)
    measured = float(np.mean([np.mean(itl[s.step]) for s in chunk_steps]))
    base = float(np.mean([fit.decode_part_ns(s) for s in chunk_steps])) / 1e6
    return PenaltyCheck(len(chunk_steps), inside, measured, pred.mean_ns / 1e6,
                        pred.lo_ns / 1e6, pred.hi_ns / 1e6, base, fit.steps, fit.rmse_ns / 1e6,
                        fit.terms, outliers=slow, fit_outliers=len(fit.outliers))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--long-prompt", type=int, default=LONG_PROMPT)
    ap.add_argument("--threads", type=int, default=1, help="torch threads while it runs")
    ap.add_argument("--machine", default=None, help="label; default: the CPU's name")
    ap.add_argument("--file", default=None,
                    help="the recording (default: <out>/cpu-prefill-tax.jsonl)")


def _row(label: str, c: PenaltyCheck) -> str:
    return (f"| {label} | {c.inside} of {c.chunk_steps} | {c.measured_itl_ms:.1f} | "
            f"{c.predicted_itl_ms:.1f} [{c.lo_ms:.1f}, {c.hi_ms:.1f}] | "
            f"{c.measured_penalty_ms:.1f} | {c.predicted_penalty_ms:.1f} ± {c.error_ms:.1f} | "
            f"{c.rmse_ms:.1f} | {c.fit_outliers} / {c.outliers} | "
            f"{'yes' if c.holds else 'no'} |")


def run(args: argparse.Namespace, out: Path) -> dict:
    t0 = time.perf_counter()
    scen = run_scenario(args.model, rounds=args.rounds, long_prompt=args.long_prompt,
                        threads=args.threads)
    wall = time.perf_counter() - t0
    full = penalty_check(scen)
    blind = penalty_check(scen, terms=("decode",), decode_only=True)
    no_prefill = penalty_check(scen, terms=("decode", "context"))
    flat = penalty_check(scen, terms=("decode",))
    print(f"{len(scen.records)} steps in {wall:.1f} s; fit terms {full.terms}, "
          f"{full.fit_steps} steps")
    print("| fit | chunk steps in their 95% PI | mean ITL ms | predicted mean ms [95%] | "
          "measured penalty ms | predicted penalty ms | fit RMSE ms | outliers (fit / chunk "
          "steps) | holds |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(_row("decode + prefill + context", full))
    print(_row("decode + context, no prefill term", no_prefill))
    print(_row("intercept of the decode-only steps (control)", blind))
    print(_row("intercept only", flat))
    machine = args.machine or f"CPU ({platform.processor() or platform.machine()})"
    first, last = scen.records[0].step, scen.records[-1].step
    meta = {"type": "meta", "machine": machine, "date": time.strftime("%Y-%m-%d"),
            "commit": short_commit(), "model": f"{Path(args.model).name}, float32",
            "workload": (f"{STREAMS} streams decoding; after a warm-up prefill, {args.rounds} "
                         f"rounds of a {args.long_prompt}-token twin and the long prompt of "
                         f"{args.long_prompt} tokens, chunked at budget {CHUNK + STREAMS}"),
            "graphs": False, "torch": torch.__version__,
            "windows": [{"label": "sync", "first_step": first, "last_step": last,
                         "wall_s": round(wall, 4), "steps": len(scen.records)}]}
    path = Path(args.file) if args.file else out / "cpu-prefill-tax.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(meta) + "\n")
        for it in [*scen.records, *scen.events]:
            f.write(json.dumps(record_to_dict(it), separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")

    def d(c: PenaltyCheck) -> dict:
        return {"chunk_steps": c.chunk_steps, "inside": c.inside,
                "mean_holds": c.mean_holds, "measured_itl_ms": c.measured_itl_ms,
                "predicted_itl_ms": c.predicted_itl_ms, "lo_ms": c.lo_ms, "hi_ms": c.hi_ms,
                "measured_penalty_ms": c.measured_penalty_ms,
                "predicted_penalty_ms": c.predicted_penalty_ms, "rmse_ms": c.rmse_ms,
                "holds": c.holds, "terms": list(c.terms), "outliers": c.outliers,
                "fit_outliers": c.fit_outliers}

    return {"file": str(path), "wall_s": wall, "fit": d(full), "control": d(blind),
            "intercept_only": d(flat), "no_prefill_term": d(no_prefill)}
