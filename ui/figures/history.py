"""The Live page's history strip: tokens/s, step busy, memory bandwidth, running/waiting.

Owns binning step records into one-second buckets (pure ``bin_steps``), the per-server
accumulator that reads the client's telemetry bus with a cursor so the history outlives the
bus's newest-N snapshot (``LiveHistory``), and the compact one-row figure of sparklines.
Values are smoothed (a 3-bucket mean) and each axis is a 1-2-5 ceiling of the window's
maximum, so a scale changes only when the load does.

To add a figure: give ``HistorySeries`` a field, fill it in ``LiveHistory.series``, and add
a ``Tile`` to ``TILES`` (the figure lays out however many there are). It must never call
streamlit and never read the bus except through ``LiveHistory.update``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from telemetry.records import StepRecord
from ui.figures.gauges import nice_ceiling

BUCKET_NS = 1_000_000_000
KEEP_BUCKETS = 120  # two minutes of history
SHOWN_S = 60


@dataclass(slots=True)
class Bucket:
    """Sums over the steps whose last span ended in one bucket."""

    steps: int = 0
    tokens: int = 0
    busy_ns: int = 0  # compute-lane time (step busy)
    running: int = 0  # of the bucket's newest step
    waiting: int = 0
    mem_bw_pct: float | None = None  # NVML GPM memory bandwidth used
    covered: bool = False  # no step ended here, one's compute ran through: its counts


def bin_steps(records: Sequence[StepRecord], bucket_ns: int = BUCKET_NS) -> dict[int, Bucket]:
    """Steps grouped by ``end // bucket_ns`` (a step's tokens, running and waiting belong
    where its last span ended); its compute time is split over the buckets the compute span
    covers, so a 5 s step reads busy for 5 s, not 500% of its last second, and its running
    and waiting counts hold in the buckets it ran through (no gap in their line)."""
    out: dict[int, Bucket] = {}
    for rec in records:
        end = rec.end_ns
        if end is None:
            continue
        b = out.setdefault(end // bucket_ns, Bucket())
        b.steps += 1
        b.tokens += rec.prefill_tokens + rec.decode_tokens
        b.running, b.waiting = rec.running, rec.waiting
        for s in rec.spans:
            if s.lane == "compute":
                _add_busy(out, s.start_ns, s.end_ns, bucket_ns, rec)
    return out


def _add_busy(out: dict[int, Bucket], start: int, end: int, bucket_ns: int,
              rec: StepRecord) -> None:
    for i in range(start // bucket_ns, (max(end, start + 1) - 1) // bucket_ns + 1):
        lo, hi = max(start, i * bucket_ns), min(end, (i + 1) * bucket_ns)
        if hi > lo:
            b = out.setdefault(i, Bucket())
            b.busy_ns += hi - lo
            if not b.steps:
                b.running, b.waiting, b.covered = rec.running, rec.waiting, True


def smooth(values: np.ndarray, width: int = 3) -> np.ndarray:
    """Trailing mean over ``width`` points (NaN-aware; the first points use what exists)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    out = np.full(values.shape, np.nan)
    for i in range(values.size):
        chunk = values[max(0, i - width + 1) : i + 1]
        chunk = chunk[~np.isnan(chunk)]
        if chunk.size:
            out[i] = chunk.mean()
    return out


@dataclass(slots=True)
class HistorySeries:
    """One value per finished bucket, oldest first; ``t_s`` is seconds before now (<= 0)."""

    t_s: np.ndarray
    tokens_per_s: np.ndarray
    step_busy_pct: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    mem_bw_pct: np.ndarray  # NaN where no GPM reading
    mem_bw_reason: str | None = None  # why there is no memory bandwidth figure
    max_num_seqs: int = 0
    step_running_s: float | None = None  # a step in flight this long, not published yet
    # Step busy over the gauges' window (ui.figures.gauges.live_window and window_busy), given by
    # the page: the strip's title then says what the step busy gauge says.
    busy_now_pct: float | None = None


def series_from_buckets(
    buckets: dict[int, Bucket],
    now_ns: int,
    seconds: int = SHOWN_S,
    bucket_ns: int = BUCKET_NS,
    *,
    in_flight_since_ns: int | None = None,
    running: int | None = None,
    waiting: int | None = None,
) -> HistorySeries:
    """The last ``seconds`` finished buckets before ``now_ns`` (empty buckets read 0: the
    engine ran nothing then).

    ``in_flight_since_ns`` (the end of the newest published compute span, given while the
    engine has a step running) makes the time after it busy, as the gauges count it: a step
    in flight is neither idle nor measured yet, so those buckets' tokens are not known (NaN)
    and their running/waiting are the engine's counts now. ``running``/``waiting`` (the
    engine's stats now) replace the newest bucket's, so the strip agrees with the gauges.
    """
    last = now_ns // bucket_ns - 1  # the current bucket is still filling: leave it out
    idx = np.arange(last - seconds + 1, last + 1)
    got = [buckets.get(int(i)) for i in idx]
    scale = 1e9 / bucket_ns
    tok = np.array([b.tokens * scale if b else 0.0 for b in got])
    busy = np.array([100.0 * b.busy_ns / bucket_ns if b else 0.0 for b in got])
    run = np.array([float(b.running) if b and (b.steps or b.covered) else 0.0 for b in got])
    wait = np.array([float(b.waiting) if b and (b.steps or b.covered) else 0.0 for b in got])
    mem = np.array([b.mem_bw_pct if b and b.mem_bw_pct is not None else np.nan for b in got])
    t = (idx + 1) * bucket_ns / 1e9 - now_ns / 1e9
    step_running_s = None
    if in_flight_since_ns is not None:
        since = in_flight_since_ns
        lo = np.maximum(idx * bucket_ns, since)
        hi = np.minimum((idx + 1) * bucket_ns, now_ns)
        busy += 100.0 * np.clip(hi - lo, 0, None) / bucket_ns
        pending = idx > since // bucket_ns
        tok[pending] = np.nan
        if running is not None:
            run[pending] = float(running)
        if waiting is not None:
            wait[pending] = float(waiting)
        step_running_s = max(0.0, (now_ns - since) / 1e9)
    if running is not None and run.size:
        run[-1] = float(running)
    if waiting is not None and wait.size:
        wait[-1] = float(waiting)
    return HistorySeries(t, tok, np.minimum(busy, 100.0), run, wait, mem,
                         step_running_s=step_running_s)


class LiveHistory:
    """Reads the client's bus with its own cursor and keeps one-second buckets.

    One per engine client (shared by every tab); a new bus (after a restart) starts a new
    history. Thread-safe: several sessions may call update() at once.
    """

    def __init__(self, keep: int = KEEP_BUCKETS) -> None:
        self._lock = threading.Lock()
        self._bus: object | None = None
        self._reader = None
        self._keep = keep
        self.buckets: dict[int, Bucket] = {}
        self.last_end_ns: int | None = None  # the newest published compute span's end

    def update(self, bus: object, nvml: dict | None, now_ns: int) -> None:
        with self._lock:
            if bus is not self._bus:
                self._bus, self.buckets, self.last_end_ns = bus, {}, None
                self._reader = bus.reader(from_now=False)  # type: ignore[attr-defined]
            assert self._reader is not None
            steps = self._reader.steps()
            ends = [s.end_ns for r in steps for s in r.spans if s.lane == "compute"]
            if ends:
                self.last_end_ns = max(self.last_end_ns or 0, *ends)
            fresh = bin_steps(steps)
            for i, b in fresh.items():
                old = self.buckets.get(i)
                if old is None:
                    self.buckets[i] = b
                    continue
                old.steps += b.steps
                old.tokens += b.tokens
                old.busy_ns += b.busy_ns
                if b.steps:
                    old.running, old.waiting, old.covered = b.running, b.waiting, False
                elif b.covered and not old.steps:  # only crossed by a compute span
                    old.running, old.waiting, old.covered = b.running, b.waiting, True
            bw = None if nvml is None else nvml.get("dram_bw_util_pct")
            if bw is not None:
                self.buckets.setdefault(now_ns // BUCKET_NS, Bucket()).mem_bw_pct = float(bw)
            cutoff = now_ns // BUCKET_NS - self._keep
            for i in [i for i in self.buckets if i < cutoff]:
                del self.buckets[i]

    def series(
        self, now_ns: int, seconds: int = SHOWN_S, stats: Mapping[str, Any] | None = None,
        in_flight: bool | None = None,
    ) -> HistorySeries:
        """The strip's series; with ``stats`` (EngineClient.stats()) the running/waiting
        counts are the engine's now, and while a step is in flight (``in_flight``, as the
        gauges decide it: ui.figures.gauges.steps_in_flight; by default, while the engine has
        requests) the time since the newest published compute span is busy."""
        with self._lock:
            buckets, last_end = dict(self.buckets), self.last_end_ns
        if stats is None:
            return series_from_buckets(buckets, now_ns, seconds)
        if in_flight is None:
            in_flight = int(stats.get("running", 0)) > 0 or int(stats.get("unfinished", 0)) > 0
        return series_from_buckets(
            buckets, now_ns, seconds,
            in_flight_since_ns=last_end if in_flight and last_end is not None else None,
            running=int(stats.get("running", 0)), waiting=int(stats.get("waiting", 0)))


def memory_bandwidth_reason(nvml: dict | None, nvml_reason: str | None,
                            device: str = "cuda") -> str | None:
    """Why there is no memory-bandwidth figure (None when there is one), as "what: why":
    the strip's tile says the first part in its title and the rest on its plot."""
    if device != "cuda":
        return ("no GPU here: it reads a GPU's memory counters (NVML GPM); this engine "
                "runs on the CPU")
    if nvml is None:
        why = (nvml_reason or "NVML is not available").removeprefix("no GPU: ")
        return f"no NVML reading: {why}"
    if nvml.get("dram_bw_util_pct") is not None:
        return None
    why = nvml.get("gpm_reason") or "it needs NVML GPM counters (Hopper or newer)"
    return f"not measured: {why}"


def _wrapped(text: str, width: int = 38) -> str:
    """``text`` broken into lines of about ``width`` characters (Plotly's <br>)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


@dataclass(slots=True, frozen=True)
class Tile:
    """One sparkline: a title with units, and which series it draws (name, values, colour)."""

    title: str
    lines: Callable[[HistorySeries], list[tuple[str, np.ndarray, str]]]
    unit: str = ""
    fixed_max: float | None = None  # e.g. 100 for a percentage
    reason: Callable[[HistorySeries], str | None] = field(default=lambda s: None)
    in_flight_note: bool = False  # say "step running N s" while a step is in flight
    # The title's figure, where it is not the line's latest smoothed value.
    now: Callable[[HistorySeries], float | None] = field(default=lambda s: None)


TILES: tuple[Tile, ...] = (
    Tile("tokens/s", lambda s: [("tokens/s", s.tokens_per_s, "#3182bd")], unit=" tok/s"),
    Tile(
        "step busy (compute lane)",
        lambda s: [("step busy", s.step_busy_pct, "#31a354")],
        unit=" %",
        fixed_max=100.0,
        in_flight_note=True,
        now=lambda s: s.busy_now_pct,
    ),
    Tile(
        "memory bandwidth used",
        lambda s: [("DRAM bandwidth", s.mem_bw_pct, "#756bb1")],
        unit=" %",
        fixed_max=100.0,
        reason=lambda s: s.mem_bw_reason,
    ),
    Tile(
        "requests running / waiting",
        lambda s: [("running", s.running, "#3182bd"), ("waiting", s.waiting, "#e6550d")],
    ),
)


def _latest(values: np.ndarray) -> float | None:
    ok = values[~np.isnan(values)]
    return float(ok[-1]) if ok.size else None


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}{unit}" if abs(v) >= 10 or unit.strip() != "%" else f"{v:.1f}{unit}"


def history_figure(s: HistorySeries, height_px: int = 150) -> go.Figure:
    """One row of sparklines (TILES), each titled with its latest smoothed value."""
    titles = []
    for tile in TILES:
        lines = tile.lines(s)
        figure = tile.now(s)
        now = (_fmt(figure, tile.unit) if figure is not None else
               " / ".join(_fmt(_latest(smooth(v)), tile.unit) for _, v, _ in lines))
        reason = tile.reason(s)
        if reason:
            titles.append(f"{tile.title}: {reason.partition(': ')[0]}")
        elif s.step_running_s is not None and tile.in_flight_note and s.step_running_s >= 1:
            # The newest seconds are a step still running: not idle, not yet measured.
            titles.append(f"{tile.title}: <b>{now}</b> · step running {s.step_running_s:.0f} s")
        else:
            titles.append(f"{tile.title}: <b>{now}</b>")
    fig = make_subplots(rows=1, cols=len(TILES), subplot_titles=titles, horizontal_spacing=0.05)
    for col, tile in enumerate(TILES, start=1):
        top = 0.0
        for name, values, colour in tile.lines(s):
            sm = smooth(values)
            fig.add_trace(
                go.Scatter(
                    x=s.t_s,
                    y=sm,
                    name=name,
                    mode="lines",
                    line={"color": colour, "width": 1.5},
                    fill="tozeroy" if len(tile.lines(s)) == 1 else None,
                    hovertemplate=f"{name} %{{y:,.1f}}{tile.unit}<br>%{{x:.0f}} s<extra></extra>",
                    showlegend=False,
                ),
                row=1,
                col=col,
            )
            if np.any(~np.isnan(sm)):
                top = max(top, float(np.nanmax(sm)))
        ymax = tile.fixed_max or nice_ceiling(max(top, 1.0))
        fig.update_yaxes(range=[0, ymax], row=1, col=col, fixedrange=True, nticks=3,
                         ticksuffix=tile.unit.strip() if tile.unit.strip() == "%" else "")
        fig.update_xaxes(range=[-SHOWN_S, 0], row=1, col=col, fixedrange=True, ticksuffix=" s",
                         nticks=4)
        reason = tile.reason(s)
        if reason:
            axis = col if col > 1 else ""
            why = reason.partition(": ")[2] or reason
            fig.add_annotation(text=_wrapped(why), showarrow=False,
                               font={"size": 11, "color": "#888"},
                               xref=f"x{axis} domain", yref=f"y{axis} domain", x=0.5, y=0.5)
    fig.update_annotations(font_size=12, selector={"showarrow": False, "yref": "paper"})
    fig.update_layout(height=height_px, margin={"l": 30, "r": 10, "t": 30, "b": 25},
                      uirevision="history", hovermode="x unified")
    return fig
