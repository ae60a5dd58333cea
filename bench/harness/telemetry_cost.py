"""What telemetry costs on the host per step, and building a trace for export: the
`telemetry` part of `python -m bench watch-cost`.

Measures, as the median over many timed runs:
- publish_step of a prebuilt record with 8 spans (what the engine pays per step), and
  building that record + publishing it (the engine's full per-step telemetry cost on CPU);
- reading a full ring of 4096 steps through a BusReader;
- busy_fraction and idle_gaps over 5,000 spans, idle_by_cause over the same 625 steps;
- chrome_trace (dict) and chrome_trace_json (dict + serialisation) of 5,000 spans.
Prints a small table. Touches no GPU.

    python -m bench watch-cost --parts telemetry [--runs N]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

from telemetry.bus import TelemetryBus
from telemetry.export import chrome_trace, chrome_trace_json, orjson
from telemetry.gaps import idle_by_cause
from telemetry.metrics import busy_fraction, idle_gaps, spans_of
from telemetry.records import LANES, Span, StepRecord

STEP_NS = 5_000_000  # a 5 ms decode step


def make_record(step: int) -> StepRecord:
    """A realistic async decode step: one span on each of 8 lanes."""
    t0 = step * STEP_NS
    lanes = [lane for lane in LANES if lane != "compute.launch"]  # an eager step: 8 lanes
    spans = [
        Span(lane, t0 + i * 400_000, t0 + i * 400_000 + 350_000) for i, lane in enumerate(lanes)
    ]
    return StepRecord(
        step=step,
        mode="async",
        slot=step % 2,
        num_requests=32,
        prefill_tokens=0,
        decode_tokens=32,
        padded_tokens=0,
        graph_bucket=32,
        spans=spans,
        running=32,
        waiting=4,
        kv_blocks_used=900,
        kv_blocks_total=4096,
    )


def median_ns(fn: Callable[[], object], runs: int, inner: int = 1) -> float:
    """Median over ``runs`` of the time per call, each run timing ``inner`` calls."""
    fn()  # warm up
    samples = []
    for _ in range(runs):
        t = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter_ns() - t) / inner)
    return statistics.median(samples)


def fmt(ns: float) -> str:
    if ns < 10_000:
        return f"{ns / 1000:.3f} us"
    if ns < 10_000_000:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e9:.3f} s"


def add_telemetry_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", type=int, default=200, help="timed runs per row (median)")


def telemetry_costs(runs: int) -> dict:
    """Each operation's median time per call (printed as a table), and the trace's size."""

    bus = TelemetryBus()
    rec = make_record(0)
    counter = iter(range(10**12))
    records_5k = [make_record(i) for i in range(625)]  # 625 steps x 8 spans = 5,000 spans
    spans_5k = spans_of(records_5k)
    window = (0, 625 * STEP_NS)
    full = TelemetryBus(step_capacity=4096)
    for i in range(4096):
        full.publish_step(make_record(i))

    rows = [
        (
            "publish_step (prebuilt record, 8 spans)",
            median_ns(lambda: bus.publish_step(rec), runs, inner=1000),
        ),
        (
            "build record (8 spans) + publish_step",
            median_ns(lambda: bus.publish_step(make_record(next(counter))), runs, inner=200),
        ),
        ("publish_step, bus disabled", _disabled(runs)),
        ("BusReader.steps() of a full 4096 ring", median_ns(lambda: full.reader().steps(), runs)),
        ("busy_fraction, 5,000 spans", median_ns(lambda: busy_fraction(spans_5k, *window), runs)),
        ("idle_gaps, 5,000 spans", median_ns(lambda: idle_gaps(spans_5k, *window), runs)),
        ("idle_by_cause, 625 steps (5,000 spans)",
         median_ns(lambda: idle_by_cause(records_5k, *window), max(runs // 10, 3))),
        ("chrome_trace dict, 5,000 spans", median_ns(lambda: chrome_trace(records_5k), runs)),
        (
            f"chrome_trace_json, 5,000 spans ({'orjson' if orjson else 'json'})",
            median_ns(lambda: chrome_trace_json(records_5k), runs),
        ),
    ]
    size = len(chrome_trace_json(records_5k))

    print(
        f"# telemetry  {datetime.date.today()}  python {platform.python_version()}  "
        f"{platform.machine()} {platform.processor() or ''}".rstrip()
    )
    print(f"# median of {runs} runs; trace of 5,000 spans = {size / 1e6:.2f} MB")
    width = max(len(name) for name, _ in rows)
    print(f"| {'operation':<{width}} | {'median':>10} |")
    print(f"|{'-' * (width + 2)}|{'-' * 12}|")
    for name, ns in rows:
        print(f"| {name:<{width}} | {fmt(ns):>10} |")
    return {"median_ns": dict(rows), "trace_bytes": size, "runs": runs}


def _disabled(runs: int) -> float:
    bus = TelemetryBus(enabled=False)
    rec = make_record(0)
    return median_ns(lambda: bus.publish_step(rec), runs, inner=1000)
