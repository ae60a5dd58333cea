"""The prefill tax on a real engine: a long prompt arrives beside 8 running streams.

Runs one in-process engine (chunked prefill; sync on a CPU) with 8 streams decoding throughout.
After a warm-up prefill, each round prefills a prompt as long as the long prompt (its twin: the
fit sees chunks like the long prompt's, as a live window that has seen prefills does) and the
long prompt, the long one second in even rounds and first in odd ones, each chunked at the
budget minus the 8 decode tokens. The step-time fit (telemetry/prefill_tax.py) is made over the
same run's steps after the warm-up *without* the long prompt's chunk steps, and predicts those:
the streams' measured inter-token latency during the long prompt's chunks (from their token
events) against the fit's prediction with its 95% interval for the mean of those steps. A fit
of the decode-only steps (what a step time measured between prefills says) is the control that
must miss.

    python -m bench prefill-tax --file docs/recordings/cpu-prefill-tax.jsonl

writes the run as a recording for the dashboard's Recordings page (the telemetry/export.py
JSON lines behind a meta line) and prints the table docs/benchmarks.md quotes. The scenario
is importable (run_scenario, penalty_check) for the engine test, which writes no file. It
imports no UI code.

On a GPU, with no model hub: random weights of a bench/harness/shapes.py shape (``--preset``,
llama-8b unless given), bf16, async batching and CUDA graphs as config.yaml says, and sizes
scaled to a GPU step (SIZES: a 4,000-token prompt and its twin, chunked at 1,024 beside the 8
decodes, 12 rounds). The table then has a second row for the full fit made over the steps'
compute spans (``source="compute"``: the device's own time) beside the step-period fit:

    python -m bench prefill-tax --device cuda     # writes <out>/cuda-llama-8b-prefill-tax.jsonl

``--device cpu --preset tiny`` runs the same random-weight path on a CPU.
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
from bench.harness.shapes import PRESETS, build_model
from engine import Engine, EngineConfig, SamplingParams
from telemetry.export import record_to_dict
from telemetry.prefill_tax import TERMS, NoFit, Term, TimeSource, fit_step_time, timed_steps
from telemetry.records import RequestEvent, StepRecord

DESCRIPTION = ("the ITL penalty a long prompt's chunked prefill puts on 8 running streams, "
               "measured against the step-time fit's prediction (CPU, or CUDA with --device cuda)")
REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = "models/gapless-tiny-python"
CUDA_PRESET = "llama-8b"  # the shape a --device cuda run builds unless --preset or --model
STREAMS = 8
CHUNK = 256  # prefill tokens a step beside the 8 decodes: the budget is CHUNK + STREAMS
FIT_PROMPTS = (1000,)  # a twin of the long prompt, beside it in time
LONG_PROMPT = 1000
ROUNDS = 6
SETTLE_STEPS = 3  # decode-only steps after each prompt
STREAM_PROMPT_MAX = 40 + 5 * (STREAMS - 1)  # the longest stream's prompt


@dataclass(slots=True, frozen=True)
class Sizes:
    """The scenario's sizes on one device: the long prompt (and its twin), the prefill chunk
    beside the 8 decodes, the rounds, and max_model_len."""

    long_prompt: int
    chunk: int
    rounds: int
    max_model_len: int


# A GPU step of 8 decodes costs about what a small chunk adds, so the GPU's chunk is 4x the
# CPU's (a 1B or 8B shape's chunk step then stands well above its decode-only step) and its
# prompt 4x as long (the same four chunks, the last one shorter); more rounds cost seconds.
SIZES = {"cpu": Sizes(LONG_PROMPT, CHUNK, ROUNDS, 1024), "cuda": Sizes(4000, 1024, 12, 4096)}
DEVICES = tuple(SIZES)


def check_device(device: str) -> None:
    """Refuse a device the suite cannot run on here, saying what is allowed."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise ValueError(f"--device cuda needs a CUDA GPU, and torch {torch.__version__} "
                         f"({built}) sees none here; run --device cpu (the default)")


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
                 chunk: int = CHUNK, threads: int | None = 1, seed: int = 0,
                 device: str = "cpu", preset: str | None = None,
                 max_model_len: int | None = None) -> ScenarioRun:
    """Run the scenario on an engine driven step by step. On the CPU: float32, sync, as the
    engine check needs. On cuda: bf16, config.yaml's async batching and CUDA graphs (kernel
    sampling off: a profiled step is not the steps it would be compared with). ``preset``: a
    random-weight model of that bench/harness/shapes.py shape instead of ``model``'s folder.
    ``threads`` torch threads while it runs (the previous number is put back; None leaves
    it): one keeps a shared machine's cores from fighting over one step. ``max_model_len``
    (default: the device's SIZES, raised to what the prompts and streams need)."""
    check_device(device)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(sorted(PRESETS))}, got {preset!r}")
    steps_needed = rounds * (sum(-(-p // chunk) for p in (*fit_prompts, long_prompt))
                             + SETTLE_STEPS * (len(fit_prompts) + 1)) + 2 * SETTLE_STEPS
    # async mode reads a prompt's last chunk a step after launching it: one step more a prompt
    stream_tokens = steps_needed + rounds * (len(fit_prompts) + 1) + 8
    max_len = max(max_model_len or SIZES[device].max_model_len,
                  max(long_prompt, *fit_prompts) + 1, STREAM_PROMPT_MAX + stream_tokens)
    max_len = -(-max_len // 16) * 16  # whole KV blocks
    dtype = "bfloat16" if device == "cuda" else "float32"
    net = None
    if preset is not None:
        net = build_model(preset, torch.device(device), getattr(torch, dtype))
        model = f"random:{preset}"
    sizes = dict(model=model, device=device, dtype=dtype, max_num_seqs=STREAMS + 2,
                 max_num_batched_tokens=chunk + STREAMS, max_model_len=max_len, block_size=16)
    if device == "cpu":
        cfg = EngineConfig(async_batching=False, **sizes)
    else:
        cfg = EngineConfig.from_yaml(REPO / "config.yaml", kernel_sample_period_s=0, **sizes)
    prev_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    rng = np.random.default_rng(seed)

    try:
        with Engine(cfg, model=net, start=False) as eng:
            top = min(8000, eng.vocab_size)

            def prompt(n: int) -> list[int]:
                return [int(x) for x in rng.integers(10, top, n)]

            stream_params = SamplingParams(max_tokens=stream_tokens, temperature=0.0,
                                           ignore_eos=True, detokenize=False)
            one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True,
                                 detokenize=False)
            streams = [eng.submit(prompt(40 + 5 * i), stream_params) for i in range(STREAMS)]
            # a first long prefill touches the KV cache's memory and each shape once (on a
            # GPU: compiles its kernels): warm-up, recorded, and left out of the check
            # (penalty_check starts after it)
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
            settings = eng.settings()
            for s in streams:
                eng.abort(s.request_id)
            while eng.step():
                pass
            records = eng.bus.snapshot_steps(100_000)
            events = eng.bus.snapshot_events(1_000_000)
    finally:
        torch.set_num_threads(prev_threads)
    label = (f"{preset} shape, random {dtype} weights" if preset is not None
             else f"{Path(model).name}, {dtype}")
    return ScenarioRun(records, events, long_ids, {s.request_id for s in streams}, first_step,
                       meta={"model": model, "model_label": label, "device": device,
                             "streams": STREAMS, "budget": chunk + STREAMS,
                             "fit_prompts": list(fit_prompts), "long_prompt": long_prompt,
                             "rounds": rounds, "threads": threads,
                             "async": bool(settings["async_batching"]),
                             "graphs": bool(settings["cuda_graphs"])})


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
                  decode_only: bool = False, source: TimeSource = "period") -> PenaltyCheck:
    """Fit on the run's steps without the long prompt's chunks; predict those steps. With
    ``decode_only`` the fit sees only the steps without a prefill chunk (the control: what a
    step time measured between prefills says). ``source="compute"`` fits the steps' compute
    spans (the device's own time) instead of their periods: the streams' measured ITL against
    it says how much of their wait the device's work explains."""
    long_steps = {r.step for r in run.records
                  if any(c[0] in run.long_ids and c[1] > 1 for c in r.chunks)}
    # every step is timed over the whole run (a step's period runs from its predecessor's
    # end, and in async mode the step after a chunk starts during it); the fit leaves out the
    # warm-up, the long prompt's chunk steps and, for the control, every prefill step
    left_out = long_steps | {r.step for r in run.records if r.step < run.first_step
                             or (decode_only and r.prefill_tokens > 0)}
    fit = fit_step_time(run.records, window_steps=len(run.records), terms=terms, source=source,
                        exclude=left_out)
    if isinstance(fit, NoFit):
        raise RuntimeError(f"the scenario's fit failed: {fit.reason}")
    itl = stream_itl_at_steps(run.records, run.events, run.stream_ids)
    chunk_steps = [s for s in timed_steps(run.records, source)
                   if s.step in long_steps and s.step in itl]
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
    ap.add_argument("--device", choices=DEVICES, default="cpu",
                    help="cpu: float32, sync (the engine check's run); cuda: bf16, async and "
                    "CUDA graphs as config.yaml says, GPU sizes, both fits")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS),
                    help=f"a random-weight model of this shape (default on cuda: {CUDA_PRESET}, "
                    "unless --model)")
    ap.add_argument("--model", default=None,
                    help=f"a local model folder (default on cpu: {DEFAULT_MODEL})")
    ap.add_argument("--rounds", type=int, default=None,
                    help=f"default: {SIZES['cpu'].rounds} on cpu, {SIZES['cuda'].rounds} on cuda")
    ap.add_argument("--long-prompt", type=int, default=None,
                    help=f"tokens of the long prompt and of its twin (default: "
                    f"{SIZES['cpu'].long_prompt} on cpu, {SIZES['cuda'].long_prompt} on cuda)")
    ap.add_argument("--chunk", type=int, default=None,
                    help=f"prefill tokens a step beside the {STREAMS} decodes; the budget is "
                    f"this + {STREAMS} (default: {SIZES['cpu'].chunk} on cpu, "
                    f"{SIZES['cuda'].chunk} on cuda)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads while it runs (default: 1 on cpu; torch's own on cuda)")
    ap.add_argument("--machine", default=None, help="label; default: the CPU's or GPU's name")
    ap.add_argument("--file", default=None,
                    help="the recording (default: <out>/cpu-prefill-tax.jsonl, on cuda "
                    "<out>/cuda-<preset>-prefill-tax.jsonl)")


@dataclass(slots=True, frozen=True)
class Plan:
    """What a run does, every option resolved against its device's defaults."""

    device: str
    preset: str | None
    model: str
    rounds: int
    long_prompt: int
    chunk: int
    threads: int | None

    @property
    def model_name(self) -> str:
        return self.preset or Path(self.model).name


def plan(args: argparse.Namespace) -> Plan:
    """The run's settings from the options (an option left out takes its device's SIZES), or
    a ValueError that says what is allowed, before any model is built."""
    check_device(args.device)
    if args.preset is not None and args.model is not None:
        raise ValueError("give --preset (random weights of a shape) or --model (a local "
                         "folder), not both")
    sizes = SIZES[args.device]
    preset = args.preset
    if preset is None and args.model is None and args.device == "cuda":
        preset = CUDA_PRESET  # no model hub on a GPU machine: random weights of a shape
    for name, value, least in (("--rounds", args.rounds, 1), ("--long-prompt", args.long_prompt, 2),
                               ("--chunk", args.chunk, 1), ("--threads", args.threads, 1)):
        if value is not None and value < least:
            raise ValueError(f"{name} must be at least {least}, got {value}")

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    threads = args.threads if args.threads is not None else (1 if args.device == "cpu" else None)
    return Plan(args.device, preset, args.model or DEFAULT_MODEL, pick(args.rounds, sizes.rounds),
                pick(args.long_prompt, sizes.long_prompt), pick(args.chunk, sizes.chunk), threads)


def _row(label: str, c: PenaltyCheck) -> str:
    return (f"| {label} | {c.inside} of {c.chunk_steps} | {c.measured_itl_ms:.1f} | "
            f"{c.predicted_itl_ms:.1f} [{c.lo_ms:.1f}, {c.hi_ms:.1f}] | "
            f"{c.measured_penalty_ms:.1f} | {c.predicted_penalty_ms:.1f} ± {c.error_ms:.1f} | "
            f"{c.rmse_ms:.1f} | {c.fit_outliers} / {c.outliers} | "
            f"{'yes' if c.holds else 'no'} |")


def run(args: argparse.Namespace, out: Path) -> dict:
    try:
        p = plan(args)
    except ValueError as exc:
        raise SystemExit(f"prefill-tax: {exc}") from None
    cuda = p.device == "cuda"
    t0 = time.perf_counter()
    scen = run_scenario(p.model, rounds=p.rounds, long_prompt=p.long_prompt,
                        fit_prompts=(p.long_prompt,), chunk=p.chunk, threads=p.threads,
                        device=p.device, preset=p.preset)
    wall = time.perf_counter() - t0
    full = penalty_check(scen)
    compute = penalty_check(scen, source="compute") if cuda else None
    blind = penalty_check(scen, terms=("decode",), decode_only=True)
    no_prefill = penalty_check(scen, terms=("decode", "context"))
    flat = penalty_check(scen, terms=("decode",))
    machine = args.machine or (torch.cuda.get_device_name() if cuda
                               else f"CPU ({platform.processor() or platform.machine()})")
    mode = ("async" if scen.meta["async"] else "sync") + ("+graphs" if scen.meta["graphs"] else "")
    budget = p.chunk + STREAMS
    print(f"{machine}: {scen.meta['model_label']}, {mode}, budget {budget}, {p.rounds} rounds "
          f"of a {p.long_prompt}-token twin and long prompt")
    print(f"{len(scen.records)} steps in {wall:.1f} s; fit terms {full.terms}, "
          f"{full.fit_steps} steps")
    print("| fit | chunk steps in their 95% PI | mean ITL ms | predicted mean ms [95%] | "
          "measured penalty ms | predicted penalty ms | fit RMSE ms | outliers (fit / chunk "
          "steps) | holds |")
    print("|---|---|---|---|---|---|---|---|---|")
    if compute is None:
        print(_row("decode + prefill + context", full))
    else:
        print(_row("decode + prefill + context, step period", full))
        print(_row("decode + prefill + context, compute span", compute))
    print(_row("decode + context, no prefill term", no_prefill))
    print(_row("intercept of the decode-only steps (control)", blind))
    print(_row("intercept only", flat))
    if compute is not None:
        print("The compute-span fit predicts the device's own time of each step; the streams' "
              "ITL above it is the host's work the async pipeline did not hide.")
    first, last = scen.records[0].step, scen.records[-1].step
    meta = {"type": "meta", "machine": machine, "date": time.strftime("%Y-%m-%d"),
            "commit": short_commit(), "model": scen.meta["model_label"],
            "workload": (f"{STREAMS} streams decoding; after a warm-up prefill, {p.rounds} "
                         f"rounds of a {p.long_prompt}-token twin and the long prompt of "
                         f"{p.long_prompt} tokens, chunked at budget {budget}"),
            "graphs": scen.meta["graphs"], "torch": torch.__version__,
            "windows": [{"label": mode, "first_step": first, "last_step": last,
                         "wall_s": round(wall, 4), "steps": len(scen.records)}]}
    default_name = f"cuda-{p.model_name}-prefill-tax.jsonl" if cuda else "cpu-prefill-tax.jsonl"
    path = Path(args.file) if args.file else out / default_name
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

    summary = {"file": str(path), "wall_s": wall, "device": p.device,
               "model": scen.meta["model_label"], "mode": mode, "budget": budget,
               "rounds": p.rounds, "long_prompt": p.long_prompt, "fit": d(full),
               "control": d(blind), "intercept_only": d(flat), "no_prefill_term": d(no_prefill)}
    if compute is not None:
        summary["fit_compute"] = d(compute)
    return summary
