"""The benchmark workload: one fixed set of requests run once per pipeline mode.

Owns BenchmarkSpec (the workload and the modes to run it in), the mode labels the dashboard
shows, and run_benchmark, which for each mode sets the engine's live settings, runs the
same seeded prompts (greedy, EOS ignored, a fixed max_tokens), keeps every step record of
that run (telemetry.collect, however long the run) and computes throughput, GPU busy
fraction and idle gaps with telemetry.metrics, so the dashboard and bench/ quote the same
arithmetic.

It must never run beside other requests (their steps would mix into the figures: it refuses
with ValueError), never leave the engine in a benchmark mode (the caller's settings are
restored, also on error or when the caller stops iterating), and never import UI code.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import LIVE_SETTINGS, SamplingParams
from engine.drivers.loadgen import prompt_vocab, random_prompt
from telemetry.collect import StepCollector
from telemetry.gaps import idle_by_cause
from telemetry.metrics import busy_fraction, idle_gaps, spans_of
from telemetry.predict import predict_async
from telemetry.records import RequestEvent, StepRecord

if TYPE_CHECKING:  # the dashboard imports this module's specs; keep torch out of it
    from engine.engine import Engine, RequestHandle

MODE_KEYS = (*LIVE_SETTINGS, "label")  # a mode sets any live setting, and may name itself
WARMUP_TOKENS = 4


def default_modes(cuda_graphs: bool = False) -> list[dict[str, Any]]:
    """Sync and async with CUDA graphs off; with ``cuda_graphs`` also both with graphs on."""
    modes: list[dict[str, Any]] = [
        {"async_batching": False, "cuda_graphs": False},
        {"async_batching": True, "cuda_graphs": False},
    ]
    if cuda_graphs:
        modes += [
            {"async_batching": False, "cuda_graphs": True},
            {"async_batching": True, "cuda_graphs": True},
        ]
    return modes


def mode_label(mode: dict[str, Any]) -> str:
    """"sync", "async+graphs", "async 3 slots", "sync budget 64"...; a mode's own "label"
    wins."""
    if mode.get("label"):
        return str(mode["label"])
    label = "async" if mode.get("async_batching", True) else "sync"
    if mode.get("cuda_graphs"):
        label += "+graphs"
    if mode.get("num_slots") is not None:
        label += f" {mode['num_slots']} slots"
    if mode.get("max_num_batched_tokens") is not None:
        label += f" budget {mode['max_num_batched_tokens']}"
    return label


def check_mode(mode: Any) -> dict[str, Any]:
    if not isinstance(mode, dict):
        raise ValueError(
            f"a benchmark mode is a dict of live settings ({', '.join(LIVE_SETTINGS)}), "
            f"got {type(mode).__name__}"
        )
    for key in mode:
        if key not in MODE_KEYS:
            raise ValueError(f"unknown benchmark mode key {key!r}; allowed: {', '.join(MODE_KEYS)}")
    return mode


@dataclass(slots=True)
class BenchmarkSpec:
    """The fixed workload. ``modes`` None means default_modes() for what the engine can do.
    ``warmup`` runs the prompts once per mode for a few tokens before measuring (first use
    of a mode pays one-off costs, such as capturing CUDA graphs). ``timeout_s`` bounds one
    mode's run."""

    num_requests: int = 16
    prompt_len: int = 64
    max_tokens: int = 64
    modes: list[dict[str, Any]] | None = None
    seed: int = 0
    warmup: bool = True
    timeout_s: float = 600.0

    def validate(self, max_model_len: int) -> None:
        for name in ("num_requests", "prompt_len", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.prompt_len + self.max_tokens > max_model_len:
            raise ValueError(
                f"prompt_len + max_tokens = {self.prompt_len + self.max_tokens} exceeds the "
                f"engine's max_model_len of {max_model_len}"
            )
        if self.modes is not None:
            if not isinstance(self.modes, list) or not self.modes:
                raise ValueError("modes must be None or a non-empty list of dicts")
            for m in self.modes:
                check_mode(m)
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")


@dataclass(slots=True)
class BenchmarkProgress:
    mode_label: str
    done: int
    total: int


@dataclass(slots=True)
class BenchmarkResult:
    """One mode's run. total_s runs from the first request queued to the last finished;
    gpu_busy and idle_* are over that window (compute lane); tokens_per_s counts generated
    tokens. tokens_digest (crc32 of every output) is equal across modes when greedy output
    does not depend on the mode, as it must not."""

    mode_label: str
    settings: dict[str, Any]
    total_s: float
    tokens_per_s: float
    gpu_busy: float
    idle_total_s: float
    idle_gaps: int
    num_steps: int
    records: list[StepRecord] = field(default_factory=list)
    generated_tokens: int = 0
    idle_largest_s: float = 0.0
    tokens_digest: int = 0
    steps_dropped: int = 0  # step records the bus overwrote before they were read (0: all kept)
    # Sync modes: total_s less what async would save (telemetry.predict), to set beside
    # the measured async mode. None for async modes.
    predicted_async_s: float | None = None
    idle_by_cause_s: dict[str, float] = field(default_factory=dict)  # telemetry.gaps causes


def benchmark_prompts(engine: Engine, spec: BenchmarkSpec) -> list[list[int]]:
    """The same prompts for every mode (and every run with the same seed)."""
    rng = random.Random(spec.seed)
    vocab = prompt_vocab(engine)
    return [random_prompt(rng, spec.prompt_len, vocab) for _ in range(spec.num_requests)]


def _busy(engine: Engine) -> int:
    """Requests the engine has not finished, counting those submitted a moment ago."""
    return int(engine.stats()["unfinished"])


_run_ids = itertools.count(1)  # request ids of different runs never collide


def run_benchmark(engine: Engine, spec: BenchmarkSpec,
                  cancel: threading.Event | None = None,
                  ) -> Iterator[BenchmarkProgress | BenchmarkResult]:
    """Run ``spec`` once per mode; yields progress as requests finish and a result per mode.

    Raises ValueError at the call, before anything runs, when the spec is invalid,
    telemetry is off, or the engine is serving other requests. Setting ``cancel`` aborts
    the run (RuntimeError at the next wait).
    """
    spec.validate(engine.max_model_len)
    if not engine.bus.enabled:
        raise ValueError("the benchmark reads step records: start the engine with telemetry on")
    busy = _busy(engine)
    if busy:
        raise ValueError(
            f"the engine is serving {busy} other request(s); a benchmark needs an idle engine "
            "(stop the load generator and let running requests finish)"
        )
    settings = engine.settings()
    original = {k: v for k, v in settings.items() if k in LIVE_SETTINGS}
    modes = spec.modes or default_modes(bool(settings["cuda_graphs_available"]))
    return _run(engine, spec, modes, original, f"bench{next(_run_ids)}", cancel)


def _run(engine: Engine, spec: BenchmarkSpec, modes: list[dict[str, Any]],
         original: dict[str, Any], run_prefix: str, cancel: threading.Event | None,
         ) -> Iterator[BenchmarkProgress | BenchmarkResult]:
    prompts = benchmark_prompts(engine, spec)
    try:
        for k, mode in enumerate(modes):
            label = mode_label(mode)
            live = {key: mode[key] for key in LIVE_SETTINGS if key in mode}
            settings = engine.configure(**live)
            prefix = f"{run_prefix}-{k}"
            if spec.warmup:
                warm = SamplingParams(max_tokens=min(WARMUP_TOKENS, spec.max_tokens),
                                      temperature=0.0, ignore_eos=True)
                for _ in _wait(engine, _submit(engine, prompts, warm, f"{prefix}-w"),
                               False, spec.timeout_s, cancel, label):
                    pass
            params = SamplingParams(max_tokens=spec.max_tokens, temperature=0.0,
                                    ignore_eos=True)
            # Drained on its own thread: every step of the run is kept, however long the
            # run and however slowly the caller iterates this generator.
            collector = StepCollector(engine.bus).start()
            try:
                handles = _submit(engine, prompts, params, prefix)
                yield from _wait(engine, handles, True, spec.timeout_s, cancel, label)
                _await_last_steps(collector, handles, prompts)
            finally:
                collector.stop()
            result = _result(label, settings, handles, collector.records, collector.events,
                             prefix)
            result.steps_dropped = collector.dropped_steps
            yield result
    finally:
        engine.configure(**original)


LAST_STEP_WAIT_S = 5.0  # a step's record is published within a step of its tokens


def _await_last_steps(collector: StepCollector, handles: list[RequestHandle],
                      prompts: list[list[int]]) -> None:
    """Wait until the collector holds the step that sampled each request's last token. A
    request finishes when its tokens are delivered, which is before its step's record is
    published (the post phase and the instruments come first): stopping the collector at
    once could leave the run's last step out of its records."""
    want = {h.request_id: len(p) + len(h.result().token_ids) - 1
            for h, p in zip(handles, prompts, strict=True)}
    deadline = time.monotonic() + LAST_STEP_WAIT_S
    while time.monotonic() < deadline:
        reached = {rid for rec in list(collector.records) for rid, _n, ctx in rec.chunks
                   if rid in want and ctx >= want[rid]}
        if len(reached) == len(want):
            return
        time.sleep(collector.period_s)


def _submit(engine: Engine, prompts: list[list[int]], params: SamplingParams,
            prefix: str) -> list[RequestHandle]:
    return [engine.submit(p, params, request_id=f"{prefix}-{i}") for i, p in enumerate(prompts)]


def _wait(engine: Engine, handles: list[RequestHandle], progress: bool, timeout_s: float,
          cancel: threading.Event | None, label: str) -> Iterator[BenchmarkProgress]:
    """Wait for every handle, yielding progress (when ``progress``) as they finish."""
    total = len(handles)
    deadline = time.monotonic() + timeout_s
    done = 0
    try:
        if progress:
            yield BenchmarkProgress(label, 0, total)
        for h in handles:
            while not h.done:
                if cancel is not None and cancel.is_set():
                    raise RuntimeError("the benchmark was cancelled")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"benchmark mode {label!r} did not finish within {timeout_s:g} s")
                try:
                    h.result(timeout=0.1)
                except TimeoutError:
                    pass
            now_done = sum(1 for x in handles if x.done)
            if progress and now_done != done:
                done = now_done
                yield BenchmarkProgress(label, done, total)
    except BaseException:
        for h in handles:  # leave no benchmark request running behind an error
            if not h.done:
                engine.abort(h.request_id)
        raise
    for h in handles:
        out = h.result()
        if out.finish_reason not in ("length", "stop"):
            raise RuntimeError(
                f"benchmark request {out.request_id} ended with {out.finish_reason!r}"
                + (f": {out.error}" if out.error else "")
            )


def _result(label: str, settings: dict[str, Any], handles: list[RequestHandle],
            records: list[StepRecord], events: list[RequestEvent],
            prefix: str) -> BenchmarkResult:
    outs = [h.result() for h in handles]
    mine = [e for e in events if e.request_id.startswith(prefix + "-")
            and e.request_id.removeprefix(prefix + "-").isdigit()]
    queued = [e.t_ns for e in mine if e.kind == "queued"]
    finished = [e.t_ns for e in mine if e.kind == "finished"]
    if not queued or not finished:  # events dropped: fall back to the step records' span
        spans = spans_of(records)
        start = min(s.start_ns for s in spans)
        end = max(s.end_ns for s in spans)
    else:
        start, end = min(queued), max(finished)
    end = max(end, start + 1)
    # A from_now reader can still catch the warmup's last step, published after its
    # requests finished: keep only the steps that overlap this run's window.
    records = [r for r in records
               if r.end_ns is not None and r.end_ns > start
               and min(s.start_ns for s in r.spans) < end]
    spans = spans_of(records)
    gaps = idle_gaps(spans, start, end)
    causes = idle_by_cause(records, start, end).by_cause
    predicted = None
    if records and all(r.mode == "sync" for r in records):
        predicted = (end - start) / 1e9 - predict_async(records).saving_s
    generated = sum(len(o.token_ids) for o in outs)
    total_s = (end - start) / 1e9
    digest = 0
    for o in outs:
        digest = zlib.crc32(repr(o.token_ids).encode(), digest)
    return BenchmarkResult(
        mode_label=label,
        settings=settings,
        total_s=total_s,
        tokens_per_s=generated / total_s,
        gpu_busy=busy_fraction(spans, start, end),
        idle_total_s=gaps.total_ns / 1e9,
        idle_gaps=gaps.count,
        num_steps=len(records),
        records=records,
        generated_tokens=generated,
        idle_largest_s=gaps.largest_ns / 1e9,
        tokens_digest=digest,
        predicted_async_s=predicted,
        idle_by_cause_s={c: ns / 1e9 for c, ns in causes.items()},
    )
