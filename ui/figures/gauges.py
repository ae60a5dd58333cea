"""The Live page's gauges: step busy beside NVML and GPM, tokens/s, requests, KV, idle by cause.

Owns turning a window of step records (plus the engine's NVML reading) into gauge values,
and the plotly figure of ``go.Indicator`` gauges in a grid. The arithmetic itself (busy
fraction, idle gaps, tokens/s) is telemetry.metrics': this module only picks the window and
lays the numbers out. Pure functions: no streamlit, no engine, no clock reads.

What each figure measures, as the gauges say: *step busy* is the union of compute spans
(a CUDA-graph step from its first kernel to its last, an eager step from when the stream
reached it); *kernel busy* (time inside kernels) is measured: the kernel time per step of
the kernel sampler's sampled steps (telemetry.kernels), given to each step in the window by
its key and context (telemetry.waterfall: the waterfall's kernel part, the same figure), over
the window; the window's own steps are not traced, so it is the busy of unperturbed steps
(without samples, a step anatomy's calibration gives an estimate, said so); *memory
bandwidth used* is NVML GPM's DRAM_BW_UTIL (Hopper+).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import plotly.graph_objects as go

from telemetry.anatomy import GapCalibration, kernel_busy_of_window
from telemetry.gaps import CAUSE_LABELS, idle_by_cause
from telemetry.kernels import KernelSample
from telemetry.metrics import busy_fraction, spans_of, step_gauges, tokens_per_second
from telemetry.records import Span, StepRecord
from telemetry.waterfall import waterfall

# Records whose latest span is further than this from the dashboard's clock are taken to be
# in another clock domain (an engine on another host): the window then ends at their end.
_CLOCK_SKEW_LIMIT_NS = 60 * 1_000_000_000


@dataclass(slots=True, frozen=True)
class GaugeValues:
    """What the gauges show. ``None`` means "not known" and is drawn as such."""

    window_ms: float
    gpu_busy: float  # step busy: fraction of the window with a compute span, 0..1
    nvml_util_pct: float | None  # None without a GPU (see nvml_reason)
    nvml_reason: str | None
    tokens_per_s: float
    decode_tokens_per_s: float
    running: int
    waiting: int
    max_num_seqs: int
    kv_usage: float  # 0..1
    idle_ms: float  # compute-idle time inside the window
    idle_gaps: int
    largest_gap_ms: float
    idle_by_cause_ms: dict[str, float] | None = None  # telemetry.gaps cause -> ms
    largest_gap_cause: str | None = None
    dram_bw_util_pct: float | None = None  # GPM memory bandwidth used, None without GPM
    gpm_reason: str | None = None
    kernel_busy: float | None = None  # None: no kernel sample (nor anatomy calibration)
    # "sampled" (measured from kernel samples) or "estimated" (an anatomy's calibration)
    kernel_busy_source: str | None = None
    # Prefix cache: prompt tokens found cached / looked up (window's admissions, else since
    # start), and prefill tokens saved since start. None: caching off or nothing looked up.
    prefix_hit_rate: float | None = None
    prefill_tokens_saved: int = 0


class LiveWindow(NamedTuple):
    """The gauges' window ``[start_ns, end_ns]``; with ``in_flight_from_ns`` a step has run
    from there to ``end_ns`` that is not published yet: busy, not idle, its tokens not
    counted until it ends."""

    start_ns: int
    end_ns: int
    in_flight_from_ns: int | None = None


def live_window(records: Sequence[StepRecord], now_ns: int, window_ms: float,
                in_flight: bool = False) -> LiveWindow:
    """The window of ``window_ms`` ending now (so an idle engine reads idle, not its last
    busy moment). With ``in_flight`` (the engine has launched a step not yet published) the
    time since the latest compute span published belongs to that step. When the records are
    in a different clock domain (an engine on another host) it ends at their latest span.
    The history strip's busy figure reads the same window (ui/figures/history.py)."""
    if window_ms <= 0:
        raise ValueError(f"window_ms must be > 0, got {window_ms}")
    last = max((r.end_ns for r in records if r.end_ns is not None), default=None)
    end = now_ns
    since = None
    if last is not None and abs(now_ns - last) > _CLOCK_SKEW_LIMIT_NS:
        end = last
    elif in_flight and last is not None:
        compute = [s.end_ns for r in records for s in r.spans if s.lane == "compute"]
        since = min(now_ns, max(compute, default=last))
    return LiveWindow(end - int(window_ms * 1e6), end, since)


def window_busy(records: Sequence[StepRecord], window: Sequence[int | None]) -> float:
    """Step busy over ``window`` (a LiveWindow, or ``(start_ns, end_ns)``): the union of the
    compute spans, and of the step in flight from ``in_flight_from_ns`` to the end."""
    start, end = int(window[0]), int(window[1])  # type: ignore[arg-type]
    spans = spans_of(records)
    since = window[2] if len(window) > 2 else None
    if since is not None:
        spans = [*spans, Span("compute", int(since), end)]
    return busy_fraction(spans, start, end)


def steps_in_flight(records: Sequence[StepRecord], stats: Mapping[str, Any] | None) -> bool:
    """Whether the engine has work the records do not show yet: unfinished requests, or
    more steps launched (stats["steps"]) than the newest published step accounts for."""
    if stats is None:
        return False
    if int(stats.get("unfinished", 0)) > 0 or int(stats.get("running", 0)) > 0:
        return True
    newest = max((r.step for r in records), default=-1)
    return int(stats.get("steps", 0)) > newest + 1


KEEP_SAMPLES = 16


def keep_samples(records: Sequence[StepRecord],
                 kept: tuple[list[KernelSample], list[StepRecord]] | None = None,
                 keep: int = KEEP_SAMPLES) -> tuple[list[KernelSample], list[StepRecord]]:
    """The latest ``keep`` kernel samples and the records of their sampled steps, from
    ``records`` (a refresh's snapshot) and what an earlier refresh ``kept``: a sample comes
    every kernel_sample_period_s (10 s by default), often less often than a snapshot of
    recent steps reaches back, so the page keeps them between refreshes for gauge_values."""
    old_samples, old_records = kept if kept is not None else ([], [])
    new = [k for r in records for k in r.kernel_samples]
    seen = {id(k) for k in old_samples}
    samples = ([*old_samples, *(k for k in new if id(k) not in seen)])[-keep:]
    wanted = {st.step for k in samples for st in k.steps}
    by_step = {r.step: r for r in (*old_records, *records) if r.step in wanted}
    return samples, [by_step[n] for n in sorted(by_step)]


def gauge_values(
    records: Sequence[StepRecord],
    window: Sequence[int | None],
    *,
    stats: Mapping[str, Any] | None = None,
    nvml: Mapping[str, Any] | None = None,
    nvml_reason: str | None = None,
    max_num_seqs: int = 0,
    calibration: GapCalibration | None = None,
    samples: Sequence[KernelSample] = (),
    sampled_records: Sequence[StepRecord] = (),
) -> GaugeValues:
    """Gauge values over ``window`` from the records, the engine's stats and NVML.

    ``stats`` (EngineClient.stats()) is preferred for running/waiting/KV because it is
    current even when no step ran lately; without it the newest record's gauges are used.
    Kernel busy is measured from ``samples`` (the kernel sampler's, from a longer stretch of
    records than the window: one comes every kernel_sample_period_s; default: those the
    window's records carry) with ``sampled_records`` (records holding the sampled steps, for
    their key and context): the waterfall's kernel part over the window. Without samples,
    ``calibration`` (from a step-anatomy recording) gives an estimate; else None.
    """
    start_ns, end_ns = int(window[0]), int(window[1])
    since = window[2] if len(window) > 2 else None
    kernel_busy, source = None, None
    samples = list(samples) or [k for r in records for k in r.kernel_samples]
    if samples and end_ns > start_ns:
        wf = waterfall(records, start_ns, end_ns, samples, sampled_records=sampled_records)
        if wf.kernel_ns is not None:
            kernel_busy, source = wf.kernel_ns / (end_ns - start_ns), "sampled"
    if kernel_busy is None and calibration is not None:
        kernel_busy = kernel_busy_of_window(records, start_ns, end_ns, calibration)
        source = "estimated"
    # The step in flight is busy: idle is looked for only before it began.
    idle_end = end_ns if since is None else max(start_ns, min(end_ns, int(since)))
    idle = idle_by_cause(records, start_ns, idle_end)
    largest = idle.largest()
    latest = step_gauges(records)
    if stats is not None:
        running, waiting = int(stats.get("running", 0)), int(stats.get("waiting", 0))
        total = int(stats.get("kv_blocks_total", 0))
        kv = int(stats.get("kv_blocks_used", 0)) / total if total else 0.0
    elif latest is not None:
        running, waiting, kv = latest.running, latest.waiting, latest.kv_usage
    else:
        running = waiting = 0
        kv = 0.0
    queried = sum(r.queried_tokens for r in records)
    cached = sum(r.cached_tokens for r in records)
    saved = 0 if stats is None else int(stats.get("prefix_cache_hits", 0))
    if not queried and stats is not None:  # nothing admitted in the window: since start
        queried, cached = int(stats.get("prefix_cache_queries", 0)), saved
    util = None if nvml is None else nvml.get("gpu_util_pct")
    dram = None if nvml is None else nvml.get("dram_bw_util_pct")
    if nvml is None:
        gpm_reason = nvml_reason or "no NVML reading yet"
    else:
        gpm_reason = nvml.get("gpm_reason") or (None if dram is not None else "no GPM reading")
    return GaugeValues(
        window_ms=(end_ns - start_ns) / 1e6,
        gpu_busy=window_busy(records, window),
        nvml_util_pct=None if util is None else float(util),
        nvml_reason=nvml_reason if util is None else None,
        tokens_per_s=tokens_per_second(records, start_ns, end_ns),
        decode_tokens_per_s=tokens_per_second(records, start_ns, end_ns, which="decode"),
        running=running,
        waiting=waiting,
        max_num_seqs=max_num_seqs,
        kv_usage=kv,
        idle_ms=idle.idle_ns / 1e6,
        idle_gaps=len(idle.gaps),
        largest_gap_ms=(largest.end_ns - largest.start_ns) / 1e6 if largest else 0.0,
        idle_by_cause_ms={c: ns / 1e6 for c, ns in idle.by_cause.items()},
        largest_gap_cause=largest.cause if largest else None,
        dram_bw_util_pct=None if dram is None else float(dram),
        gpm_reason=None if dram is not None else gpm_reason,
        kernel_busy=kernel_busy,
        kernel_busy_source=source,
        prefix_hit_rate=cached / queried if queried else None,
        prefill_tokens_saved=saved,
    )


def prefix_line(v: GaugeValues) -> str:
    """The prefix cache beside KV in use: "prefix hits 82% · 12,345 prefill tok saved"."""
    if v.prefix_hit_rate is None:
        return "prefix cache: no lookups yet"
    return (f"prefix hits {100 * v.prefix_hit_rate:.0f}% · "
            f"{v.prefill_tokens_saved:,} prefill tok saved")


def top_causes(v: GaugeValues, n: int = 2) -> str:
    """"CPU schedule/prepare/launch 1.2 ms, H2D copy 0.3 ms": the biggest idle causes."""
    causes = sorted(((ms, c) for c, ms in (v.idle_by_cause_ms or {}).items() if ms > 0),
                    reverse=True)[:n]
    return ", ".join(f"{CAUSE_LABELS.get(c, c)} {ms:,.1f} ms" for ms, c in causes)


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 2, 5 x 10^k that is >= x (a gauge axis that does not jitter)."""
    if x <= 0:
        raise ValueError(f"x must be > 0, got {x}")
    scale = 10.0 ** math.floor(math.log10(x))
    for m in (1.0, 2.0, 5.0, 10.0):
        if m * scale >= x * (1 - 1e-12):
            return m * scale
    return 10.0 * scale  # pragma: no cover - the loop always returns


def _gauge(
    title: str,
    value: float | None,
    *,
    axis_max: float,
    suffix: str,
    row: int,
    col: int,
    colour: str = "#31a354",
    subtitle: str | None = None,
    fmt: str = ".1f",
) -> go.Indicator:
    return go.Indicator(
        mode="gauge+number" if value is not None else "gauge",
        value=value if value is not None else 0.0,
        name=title,
        number={"suffix": suffix, "valueformat": fmt, "font": {"size": NUMBER_FONT_PX}},
        title={"text": title, "font": {"size": 13}},
        gauge={
            "axis": {"range": [0, axis_max]},
            "bar": {"color": colour if value is not None else "rgba(0,0,0,0)"},
        },
        domain={"row": row, "column": col},
        meta={"subtitle": subtitle},
    )


def _number(
    title: str,
    value: float,
    *,
    row: int,
    col: int,
    suffix: str = "",
    fmt: str = ",.0f",
    subtitle: str | None = None,
) -> go.Indicator:
    # The title is an annotation above the cell (see _place): Plotly sets a number's own
    # title by the number's glyphs, and over a narrow one ("0") it sat on the number.
    return go.Indicator(
        mode="number",
        value=value,
        name=title,
        number={"suffix": suffix, "valueformat": fmt, "font": {"size": NUMBER_FONT_PX}},
        domain={"row": row, "column": col},
        meta={"subtitle": subtitle, "title": title},
    )


# The numbers have one size, which fits every cell at 1280 px: left to Plotly, a number
# filled its cell and was written over its label ("waiting requests" over its "0").
NUMBER_FONT_PX = 40
CELL_GAP_X = 0.06  # between columns, of the figure's width: the axes' end labels
# Each row: the title above the cell (Plotly puts it there), the cell, then the subtitle
# under it, outside the cell: as the title's second line it ran into the gauge's tick
# labels ("of max 16" over the "8").
ROW_CELLS = ((0.62, 0.92), (0.12, 0.42))
SUBTITLE_GAP = 0.03
SUBTITLE_CHARS = 44  # a subtitle's line at 1280 px (4 or 5 cells in a row)


def _place(indicators: list[go.Indicator], columns: int) -> list[dict]:
    """Give each indicator its cell's x/y domain, and return the annotations of the
    subtitles, each centred under its indicator, and of the numbers' titles, above theirs
    (each annotation's ``name`` is its indicator's)."""
    notes = []
    width = (1 - CELL_GAP_X * (columns - 1)) / columns
    for ind in indicators:
        row, col = int(ind.domain.row), int(ind.domain.column)
        x0 = col * (width + CELL_GAP_X)
        y0, y1 = ROW_CELLS[row]
        ind.domain = {"x": [x0, x0 + width], "y": [y0, y1], "row": row, "column": col}
        meta = ind.meta or {}
        if meta.get("title"):  # a number's title, above its cell
            notes.append({"text": meta["title"], "name": ind.name, "x": x0 + width / 2,
                          "y": y1 + SUBTITLE_GAP, "xref": "paper", "yref": "paper",
                          "xanchor": "center", "yanchor": "bottom", "showarrow": False,
                          "font": {"size": 13}})
        if meta.get("subtitle"):
            notes.append({"text": _lines(meta["subtitle"], SUBTITLE_CHARS), "name": ind.name,
                          "x": x0 + width / 2, "y": y0 - SUBTITLE_GAP, "xref": "paper",
                          "yref": "paper", "xanchor": "center", "yanchor": "top",
                          "showarrow": False, "font": {"size": 11, "color": "gray"}})
        ind.meta = None
    return notes


def _lines(text: str, width: int) -> str:
    """``text`` in lines of about ``width`` characters, two at most (Plotly's <br>)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > 2:
        lines = [lines[0], " ".join(lines[1:])[: width - 1] + "…"]
    return "<br>".join(lines)


def gauges_figure(v: GaugeValues, height_px: int = 440, device: str = "cuda") -> go.Figure:
    """Ten indicators on a 2 x 5 grid: step busy, kernel busy, NVML utilisation and memory
    bandwidth used (GPM) side by side on the first row.

    ``device`` is the engine's (settings["device"]): off a GPU nothing says "GPU", "kernel"
    or "graphs": the compute lane is a worker thread there, and kernel busy, NVML and GPM,
    having nothing to measure, are left out (seven indicators on 2 x 4). Each indicator's
    title is one line above it and its subtitle an annotation under it (named by the
    title).
    """
    gpu = device == "cuda"
    window = f"last {v.window_ms / 1000:.1f} s"
    if v.nvml_util_pct is None:
        nvml_sub = v.nvml_reason or "no reading yet"
    else:
        nvml_sub = "periods with any kernel running"
    tok_axis = nice_ceiling(max(v.tokens_per_s, 100.0))
    seq_axis = float(max(v.max_num_seqs, v.running, 1))
    causes = top_causes(v)
    busy_sub = (f"first kernel to last (graphs), {window}" if gpu
                else f"compute worker thread busy, {window}")
    kernel_sub = {
        "sampled": f"measured: sampled steps' kernel time per step, {window}",
        "estimated": "estimated: step busy less the step anatomy's in-step gaps",
    }.get(v.kernel_busy_source or "", "no kernel sample yet (kernel_sample_period_s)")
    gpm_sub = v.gpm_reason if v.dram_bw_util_pct is None else "DRAM, % of peak"
    idle_name = "GPU idle" if gpu else "compute idle"
    indicators = [
        _gauge("step busy", 100 * v.gpu_busy, axis_max=100, suffix="%", row=0, col=0,
               subtitle=busy_sub),
        _gauge("kernel busy", None if v.kernel_busy is None else 100 * v.kernel_busy,
               axis_max=100, suffix="%", row=0, col=1, colour="#006d2c", subtitle=kernel_sub),
        _gauge("NVML utilisation", v.nvml_util_pct, axis_max=100, suffix="%", row=0, col=2,
               colour="#756bb1", subtitle=nvml_sub),
        _gauge("memory bandwidth used (GPM)", v.dram_bw_util_pct, axis_max=100, suffix="%",
               row=0, col=3, colour="#9e9ac8", subtitle=gpm_sub),
        _gauge("tokens/s", v.tokens_per_s, axis_max=tok_axis, suffix="", row=0, col=4,
               colour="#3182bd", subtitle=f"decode {v.decode_tokens_per_s:,.0f}/s, {window}",
               fmt=",.0f"),
        _gauge("KV cache used", 100 * v.kv_usage, axis_max=100, suffix="%", row=1, col=0,
               colour="#e6550d", subtitle=prefix_line(v)),
        _gauge("running requests", float(v.running), axis_max=seq_axis, suffix="", row=1,
               col=1, colour="#3182bd",
               subtitle=f"of max {v.max_num_seqs}" if v.max_num_seqs else None, fmt=",.0f"),
        _number("waiting requests", float(v.waiting), row=1, col=2, subtitle="queued"),
        _number(idle_name, v.idle_ms, row=1, col=3, suffix=" ms", fmt=",.1f",
                subtitle=f"{v.idle_gaps} gaps: {causes}" if causes
                else f"{v.idle_gaps} gaps, {window}"),
        _number("largest idle gap", v.largest_gap_ms, row=1, col=4, suffix=" ms", fmt=",.2f",
                subtitle=CAUSE_LABELS.get(v.largest_gap_cause or "", None)),
    ]
    columns = 5
    if not gpu:  # kernel busy, NVML and GPM measure a GPU: left out, the rest on 2 x 4
        indicators = [indicators[0], *indicators[4:]]
        columns = 4
        for i, ind in enumerate(indicators):
            ind.domain = {"row": i // columns, "column": i % columns}
    notes = _place(indicators, columns)
    fig = go.Figure(indicators)
    fig.update_layout(height=height_px, margin={"l": 30, "r": 30, "t": 40, "b": 10},
                      annotations=notes)
    return fig
