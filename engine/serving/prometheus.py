"""Prometheus metrics of one engine, read through its client: vLLM's names, and gapless:* ours.

Owns what /metrics says and how it is gathered. A daemon thread in the HTTP process reads
the client's telemetry mirror every ``period_s`` (new RequestEvents and StepRecords feed
counters and histograms) and asks the engine for stats() / settings() every
``engine_period_s`` (cached for the gauges; each is a round-trip the engine process
answers, so not more often than a scrape could use). A scrape only
renders what is held, so it never waits on the engine and a wedged engine cannot hang
Prometheus. It must never run in the engine process, never block the event loop and never
raise into the poll loop because the engine died (engine_up goes to 0 instead).

Names follow vLLM where the meaning is the same, with vLLM's ``model_name`` and ``engine``
labels and buckets (metric_names.py), so existing dashboards work: vllm:num_requests_running
/ _waiting, vllm:kv_cache_usage_perc (and its older name vllm:gpu_cache_usage_perc; a
fraction in [0, 1] as in vLLM), vllm:generation_tokens_total, vllm:num_preemptions_total, and
the per-request series request_metrics.py counts as vLLM counts them (prompt tokens at the
first token, aborted requests left out of the finished-request series). Ours:
gapless:requests_aborted_total, gapless:requests_failed_total{reason} (a request that an engine
death ended counts as reason="engine_dead"), gapless:step_busy_seconds_total,
gapless:device_idle_seconds_total{cause}, gapless:steps_total{mode,cuda_graph},
gapless:padded_tokens_total, gapless:discarded_tokens_total, gapless:stalls_total{cause} and
gapless:stall_max_seconds (the engine names each stall; its record carries the verdict),
gapless:kv_blocks_used / _total,
gapless:async_batching, gapless:num_slots, gapless:cuda_graphs(_available), gapless:engine_up,
gapless:telemetry_dropped_records_total, and with a GPU NVML's gapless:gpu_utilization_percent,
gapless:gpu_memory_used_bytes / _total_bytes, gapless:gpu_sm_clock_mhz, gapless:gpu_power_watts,
and where GPM works gapless:gpu_dram_bandwidth_percent, _sm_active_percent, _sm_occupancy_percent.

Figures from telemetry (prompt tokens, latencies, steps, busy, idle) count only while the
engine's telemetry is on; generation tokens and the gauges come from stats() and always do.
Every counter is monotonic for the life of this process: the engine's own counters start at 0
in each new engine process, so what the previous one had counted is carried on top
(EngineCounters).
Kernel busy (time inside kernels) needs a profiler recording and is not exported.

A scrape is served from bytes the poll thread renders after each poll (every ``period_s``):
it takes no lock and no thread, so /metrics stays fast while hundreds of requests queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.serving import metric_names as mn
from engine.serving.request_metrics import RequestMetrics
from telemetry.metrics import busy_intervals
from telemetry.records import StepRecord
from telemetry.stalls import STALL_CAUSE_NAMES
from telemetry.waterfall import WaterfallMeter

log = logging.getLogger("gapless.http")

# NVML's latest reading (telemetry/nvml.py's field names) -> gauge.
NVML_GAUGES = (
    ("gpu_util_pct", "gapless:gpu_utilization_percent", "NVML GPU utilisation (counts any "
     "sample period in which a kernel ran: reads higher than step busy)."),
    ("memory_used_bytes", "gapless:gpu_memory_used_bytes", "GPU memory in use (NVML)."),
    ("memory_total_bytes", "gapless:gpu_memory_total_bytes", "GPU memory in all (NVML)."),
    ("sm_clock_mhz", "gapless:gpu_sm_clock_mhz", "SM clock (NVML)."),
    ("power_w", "gapless:gpu_power_watts", "Board power draw (NVML)."),
    # GPM (Hopper and newer), over the interval between two NVML polls.
    ("dram_bw_util_pct", "gapless:gpu_dram_bandwidth_percent", "Memory bandwidth used, % of "
     "peak (NVML GPM DRAM_BW_UTIL): how near the byte floor decode runs."),
    ("sm_util_pct", "gapless:gpu_sm_active_percent", "SM activity, % (NVML GPM SM_UTIL)."),
    ("sm_occupancy_pct", "gapless:gpu_sm_occupancy_percent", "SM occupancy, % (NVML GPM "
     "SM_OCCUPANCY)."),
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineMetrics:
    """The registry behind /metrics for one client. start() / stop() the poll thread."""

    def __init__(self, client: Any, model_name: str, period_s: float = 0.25,
                 engine_period_s: float = 1.0, max_model_len: int = 2048) -> None:
        self.client = client
        self.model_name = model_name
        self.period_s = period_s  # reading the local telemetry mirror: no engine call
        self.engine_period_s = engine_period_s  # stats() + settings(): engine round-trips
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = RequestMetrics(r, model_name, max_model_len)
        self._busy = Counter("gapless:step_busy_seconds", "Time the compute lane was busy: "
                             "each step's compute span (its first kernel to its last), "
                             "overlaps counted once.", registry=r)
        self._idle = Counter("gapless:device_idle_seconds", "Compute-lane gaps between steps. "
                             "cause=host: requests were in flight, the device waited on the "
                             "CPU; cause=no_requests: nothing to run. Counted when the next "
                             "step starts.", ["cause"], registry=r)
        self._steps = Counter("gapless:steps", "Engine steps by mode and whether a CUDA graph "
                              "ran them.", ["mode", "cuda_graph"], registry=r)
        for cause in ("host", "no_requests"):  # at 0 from the start, so rate() has a series
            self._idle.labels(cause)
        for mode in ("sync", "async"):
            self._steps.labels(mode, "false")
        # The step waterfall (telemetry/waterfall.py): wall time by component, kernel time
        # split by the engine's kernel samples; the floor from each record's floor_ns (the
        # engine's byte floor of the step at its measured peak copy rate; 0 on a CPU).
        self._waterfall = WaterfallMeter()
        self._components = Counter("gapless:step_seconds", "Wall time by waterfall "
                                   "component: floor, kernels_above_floor, in_step_gaps "
                                   "(measured kernels of sampled steps), idle_cpu, "
                                   "idle_launch, copies_sync, no_work, compute_unsampled "
                                   "(step busy before any kernel sample).", ["component"],
                                   registry=r)
        for component in self._waterfall.totals_ns:
            self._components.labels(component)
        self._padded = Counter("gapless:padded_tokens", "Tokens added to reach a CUDA graph's "
                               "bucket.", registry=r)
        # Stalls (telemetry/stalls.py): the engine judges each step once and its record
        # carries the verdict; this counts the verdicts it reads, by cause.
        self._stalls = Counter("gapless:stalls", "Steps much slower than recent steps of their "
                               "kind, by cause (docs/stalls.md).", ["cause"], registry=r)
        for cause in STALL_CAUSE_NAMES:
            self._stalls.labels(cause)
        self._stall_max = Gauge("gapless:stall_max_seconds", "The longest stall's interval "
                                "(from the step before it to its end), seconds.", registry=r)
        self._stall_max_ns = 0
        self._dropped = Counter("gapless:telemetry_dropped_records", "Telemetry records this "
                                "server read too late to see (metrics from telemetry miss "
                                "them).", registry=r)
        self.registry.register(_LiveGauges(self))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bus: Any = None
        self._reader: Any = None
        self._last_end: int | None = None
        self._had_work = False
        self.counters = EngineCounters()
        self.stats: dict[str, Any] | None = None
        self.settings: dict[str, Any] | None = None
        self.nvml: dict[str, Any] | None = None
        self._rendered: bytes | None = None

    # ------------------------------------------------------------------------ polling
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="gapless-http-metrics")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        last_engine_poll = 0.0
        while not self._stop.wait(self.period_s):
            now = time.monotonic()
            with_engine = now - last_engine_poll >= self.engine_period_s
            if with_engine:
                last_engine_poll = now
            try:
                self.poll(with_engine)
            except Exception:  # keep serving the last figures
                log.exception("metrics poll failed")

    def poll(self, with_engine: bool = True) -> None:
        """Read what is new on the telemetry mirror and, ``with_engine``, ask the engine
        for stats() and settings() (callable directly, e.g. in tests); then render the
        exposition that scrapes are served until the next poll."""
        try:
            self._poll(with_engine)
        finally:
            rendered = self.render_now()
            self._rendered = rendered  # one reference swap: a scrape reads either whole

    def _poll(self, with_engine: bool) -> None:
        # Asked before reading: once the engine is seen dead, everything it sent is on the bus.
        dead = not self.client.alive()
        with self._lock:
            bus = self.client.telemetry()
            if bus is not self._bus:  # first poll, or the engine restarted
                if self._reader is not None:
                    self._read()  # the old engine's last records
                    self.requests.engine_gone()
                self._bus, self._reader = bus, bus.reader()
                self._last_end = None
            self._read()
            if dead:
                self.requests.engine_gone()
        if not with_engine:
            return
        alive = not dead and self.client.alive()
        try:
            stats = self.client.stats() if alive else None
            settings = self.client.settings() if alive else None
        except Exception:  # EngineDead, TimeoutError: the gauges say the engine is down
            stats = settings = None
        if stats is not None:
            stats = self.counters.carry(stats, getattr(self.client, "pid", None))
        self.stats, self.settings = stats, settings
        nvml = getattr(self.client, "nvml", None)  # local: the mirror's latest reading
        self.nvml = nvml() if nvml is not None and alive else None

    def _read(self) -> None:
        dropped = self._reader.dropped
        for ev in self._reader.events():
            self.requests.on_event(ev)
        self._on_steps(self._reader.steps())
        if self._reader.dropped > dropped:
            self._dropped.inc(self._reader.dropped - dropped)

    def _on_steps(self, records: list[StepRecord]) -> None:
        for component, ns in self._waterfall.add(sorted(records, key=lambda r: r.step)).items():
            self._components.labels(component).inc(ns / 1e9)
        for rec in sorted(records, key=lambda r: r.step):
            self._steps.labels(rec.mode, "true" if rec.graph_bucket is not None else "false").inc()
            if rec.padded_tokens:
                self._padded.inc(rec.padded_tokens)
            if rec.stall:
                self._stalls.labels(rec.stall).inc()
                if rec.stall_ns > self._stall_max_ns:
                    self._stall_max_ns = rec.stall_ns
                    self._stall_max.set(rec.stall_ns / 1e9)
            compute = [s for s in rec.spans if s.lane == "compute"]
            if not compute:
                continue
            start = min(s.start_ns for s in compute)
            end = max(s.end_ns for s in compute)
            lo = start if self._last_end is None else max(start, self._last_end)
            if self._last_end is not None and start > self._last_end:
                cause = "host" if self._had_work else "no_requests"
                self._idle.labels(cause).inc((start - self._last_end) / 1e9)
            if end > lo:
                starts, ends = busy_intervals(compute, lo, end)
                self._busy.inc(float((ends - starts).sum()) / 1e9)
            self._last_end = end if self._last_end is None else max(self._last_end, end)
            self._had_work = rec.running + rec.waiting > 0

    # ------------------------------------------------------------------------ scrape
    def render(self) -> bytes:
        """The text exposition format (Prometheus 0.0.4) as of the last poll: no lock, no
        engine call, cheap enough to answer on the event loop."""
        rendered = self._rendered
        return rendered if rendered is not None else self.render_now()

    def render_now(self) -> bytes:
        """The exposition of everything held now (the poll thread's work)."""
        with self._lock:
            return generate_latest(self.registry)


class EngineCounters:
    """The engine's own counters (stats()) made monotonic across engine processes: when the
    engine is another one (its pid changed) or a counter went down, what was counted before
    is carried on top of the new process's figures."""

    def __init__(self) -> None:
        self.engine: Any = None
        self.last: dict[str, float] = {}  # the engine's own figures, as last read
        self.carried: dict[str, float] = {}  # what earlier engine processes counted

    def carry(self, stats: dict[str, Any], engine: Any) -> dict[str, Any]:
        """``stats`` with every counter key monotonic (a new dict)."""
        if engine != self.engine and self.engine is not None:
            self._carry_all()
        self.engine = engine
        if any(stats.get(k, self.last[k]) < self.last[k] for k in self.last):
            self._carry_all()  # the same pid, yet counting again from 0: a new process
        out = dict(stats)
        for key in COUNTER_KEYS:
            if key in stats:
                self.last[key] = stats[key]
                out[key] = stats[key] + self.carried.get(key, 0)
        return out

    def _carry_all(self) -> None:
        for key, value in self.last.items():
            self.carried[key] = self.carried.get(key, 0) + value
        self.last = {}


SENTINEL_COUNTERS = (
    ("sentinel_checked", "gapless:sentinel_checked", "Finished greedy requests the "
     "async-correctness sentinel re-scored through the synchronous path."),
    ("sentinel_mismatches", "gapless:sentinel_mismatches", "Re-scored requests with at least "
     "one token the synchronous path would not have produced."),
    ("sentinel_tokens_checked", "gapless:sentinel_tokens_checked", "Output tokens the "
     "sentinel re-scored."),
    ("sentinel_tokens_mismatched", "gapless:sentinel_tokens_mismatched", "Re-scored output "
     "tokens that did not match."),
)


# stats() keys that are counters: monotonic within one engine process.
COUNTER_KEYS = ("generated_tokens", "preemptions", "prefix_cache_queries", "prefix_cache_hits",
                "discarded_tokens", *(key for key, _, _ in SENTINEL_COUNTERS))


class _LiveGauges(Collector):
    """Gauges and engine-wide counters from the last cached stats() / settings()."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        stats, settings, name = self.m.stats, self.m.settings, self.m.model_name
        up = GaugeMetricFamily("gapless:engine_up", "1 while the engine process answers.")
        up.add_metric([], 1.0 if stats is not None else 0.0)
        yield up
        if stats is None or settings is None:
            return

        labels, values = list(mn.LABELS), [name, mn.ENGINE_INDEX]

        def gauge(metric: str, doc: str, value: float, labelled: bool = True) -> Metric:
            g = GaugeMetricFamily(metric, doc, labels=labels if labelled else None)
            g.add_metric(values if labelled else [], float(value))
            return g

        def counter(metric: str, doc: str, value: float, labelled: bool = True) -> Metric:
            c = CounterMetricFamily(metric, doc, labels=labels if labelled else None)
            c.add_metric(values if labelled else [], float(value))
            return c

        total = stats.get("kv_blocks_total") or 0
        usage = stats.get("kv_blocks_used", 0) / total if total else 0.0
        yield gauge(mn.NUM_REQUESTS_RUNNING, "Requests in the running batch.",
                    stats["running"])
        yield gauge(mn.NUM_REQUESTS_WAITING, "Requests queued, not yet running.",
                    stats["waiting"])
        yield gauge(mn.KV_CACHE_USAGE, "Fraction of KV-cache blocks in use (0-1).",
                    usage)
        yield gauge(mn.GPU_CACHE_USAGE, "Older name of vllm:kv_cache_usage_perc.",
                    usage)
        yield counter(mn.GENERATION_TOKENS, "Output tokens generated (engine stats).",
                      stats["generated_tokens"])
        yield counter(mn.NUM_PREEMPTIONS, "Requests preempted (to be recomputed).",
                      stats["preemptions"])
        # vLLM v1's prefix-cache counters (exposed with _total): tokens looked up, and hits.
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in tokens (prompt "
                      "tokens of admitted requests).", stats.get("prefix_cache_queries", 0))
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens (prompt tokens "
                      "whose KV was reused).", stats.get("prefix_cache_hits", 0))
        yield counter("gapless:discarded_tokens", "Tokens computed one step late for a "
                      "request that had already finished, never emitted.",
                      stats["discarded_tokens"], labelled=False)
        yield gauge("gapless:kv_blocks_used", "KV-cache blocks in use.",
                    stats["kv_blocks_used"], labelled=False)
        yield gauge("gapless:kv_blocks_total", "KV-cache blocks in all.", total,
                    labelled=False)
        yield gauge("gapless:async_batching", "1 when steps run asynchronously.",
                    bool(settings.get("async_batching")), labelled=False)
        yield gauge("gapless:num_slots", "Sets of step buffers alternated.",
                    settings.get("num_slots", 0), labelled=False)
        yield gauge("gapless:cuda_graphs", "1 when steps replay CUDA graphs.",
                    bool(settings.get("cuda_graphs")), labelled=False)
        yield gauge("gapless:cuda_graphs_available", "1 when CUDA graphs can be turned on.",
                    bool(settings.get("cuda_graphs_available")), labelled=False)
        yield gauge("gapless:max_num_batched_tokens", "The token budget of a step (a live "
                    "setting).", settings.get("max_num_batched_tokens", 0), labelled=False)
        # The async-correctness sentinel (engine/instruments/sentinel.py), while it is on: its
        # mismatch rate is rate(mismatches) / rate(checked).
        for key, metric, doc in SENTINEL_COUNTERS:
            if key in stats:
                yield counter(metric, doc, stats[key], labelled=False)
        for key, metric, doc in NVML_GAUGES:
            value = (self.m.nvml or {}).get(key)
            if value is not None:  # no GPU, or a field the device does not report
                yield gauge(metric, doc, value, labelled=False)
