"""The Gantt timeline: one lane per CPU phase and per device stream, built from StepRecords.

Owns the maths from records to drawable bars (recent window, pixel merging) and the plotly
figure. Pure functions: no streamlit, no engine, no clock reads. Bars are numeric
``go.Bar(orientation="h", base=start, x=duration)`` over numpy arrays, one trace per lane,
because ``px.timeline`` truncates durations to whole milliseconds (docs/design.md §7).

Time is shown in milliseconds relative to the window end (0 = newest, negative = older).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from telemetry.records import LANES, RANK_LANE_KINDS, StepRecord
from ui.figures.lanes import CPU_GROUP, lane_group, legend_name, rank_lane_colour

# Lane colours: CPU phases in blues/greys, device streams in warm colours, so a glance tells
# the CPU rows from the GPU rows.
LANE_COLOURS: dict[str, str] = {
    "cpu.schedule": "#9ecae1",
    "cpu.prepare": "#4292c6",
    "cpu.launch": "#2171b5",
    "cpu.wait": "#bdbdbd",
    "cpu.post": "#08519c",
    "h2d": "#fd8d3c",
    "compute.launch": "#a1d99b",
    "compute": "#31a354",
    "d2h": "#e6550d",
}

DEFAULT_WIDTH_PX = 1200
# The legend's rows (an entry or a group's title, font 11) and the gap between its groups:
# a figure is made tall enough for its legend, which would otherwise get a scroll bar.
LEGEND_ROW_PX = 24  # generous: the dashboard font sets rows of about 19-20 px
LEGEND_GROUP_GAP_PX = 6
# Records whose spans all end before the window must follow each other this many times
# before a backwards scan stops: steps overlap in async mode, so ends are not quite sorted.
_TAIL_SCAN = 16


@dataclass(slots=True, frozen=True)
class LaneBars:
    """The bars of one lane after merging, as parallel arrays (times in host ns).

    ``owner`` indexes the step record the bar came from (the first one, for a merged bar);
    ``count`` is how many spans the bar stands for (1 = an unmerged span).
    """

    lane: str
    start_ns: np.ndarray
    end_ns: np.ndarray
    owner: np.ndarray
    owner_last: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return int(self.start_ns.shape[0])


def lane_row(lane: str, lanes: Sequence[str] = LANES) -> int:
    """The row of ``lane`` on the y axis: its index in ``lanes`` (0 = drawn on top)."""
    return list(lanes).index(lane)


# Lanes only a GPU engine fills (the stretch from a graph's launch to its first kernel):
# drawn when the records carry them, never as an empty row without a legend entry.
GPU_ONLY_LANES: tuple[str, ...] = ("compute.launch",)


def lanes_of(records: Sequence[StepRecord]) -> tuple[str, ...]:
    """LANES (GPU_ONLY_LANES only where the records carry them), then the per-rank lanes of
    a tensor-parallel engine that the records carry ("rank0.comm", "rank1.compute",
    "rank1.comm", ...), by rank."""
    extra: set[str] = set()
    present: set[str] = set()
    for rec in records:
        for span in rec.spans:
            present.add(span.lane)
            if span.lane.startswith("rank"):
                extra.add(span.lane)

    def key(lane: str) -> tuple[int, int]:
        rank, _, kind = lane[4:].partition(".")
        order = RANK_LANE_KINDS.index(kind) if kind in RANK_LANE_KINDS else len(RANK_LANE_KINDS)
        return (int(rank) if rank.isdigit() else 1 << 30, order)

    base = tuple(lane for lane in LANES if lane not in GPU_ONLY_LANES or lane in present)
    return base + tuple(sorted(extra, key=key))


def window_end_ns(records: Sequence[StepRecord]) -> int | None:
    """The latest step end among ``records`` (StepRecord.end_ns; None when no step has a
    span)."""
    ends = [r.end_ns for r in records if r.end_ns is not None]
    return max(ends) if ends else None


def recent_window(
    records: Sequence[StepRecord], window_ms: float, end_ns: int | None = None
) -> list[StepRecord]:
    """The records with at least one span overlapping ``[end_ns - window_ms, end_ns]``.

    ``end_ns`` defaults to the latest span end, so a paused or idle engine still shows its
    last activity rather than an empty window. Order is kept. Records are expected in
    publish order (as the bus holds them): the scan walks back from the newest and stops
    after a run of records entirely before the window, so its cost follows the window,
    not the history.
    """
    if window_ms <= 0:
        raise ValueError(f"window_ms must be > 0, got {window_ms}")
    if end_ns is None:
        end_ns = window_end_ns(records[-_TAIL_SCAN:])
        if end_ns is None:
            end_ns = window_end_ns(records)
        if end_ns is None:
            return []
    start_ns = end_ns - int(window_ms * 1e6)
    kept: list[StepRecord] = []
    before = 0
    for rec in reversed(records):
        end = rec.end_ns
        if end is None:
            continue
        if end < start_ns:
            before += 1
            if before >= _TAIL_SCAN:
                break
            continue
        before = 0
        if min(s.start_ns for s in rec.spans) <= end_ns:
            kept.append(rec)
    kept.reverse()
    return kept


def merge_thin(
    start_ns: np.ndarray, end_ns: np.ndarray, owner: np.ndarray, min_ns: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge runs of spans thinner than ``min_ns`` whose gaps are also thinner than it.

    Input is one lane's spans sorted by start. A span at least ``min_ns`` long is never
    merged (its hover keeps the exact step facts); consecutive thin spans separated by less
    than ``min_ns`` become one bar from the first start to the last end, since no screen
    could show the gaps between them. Returns ``(start, end, first_owner, last_owner,
    count)``.
    """
    n = start_ns.shape[0]
    if n == 0 or min_ns <= 0:
        ones = np.ones(n, dtype=np.int64)
        return start_ns, end_ns, owner, owner, ones
    thin = (end_ns - start_ns) < min_ns
    joins = np.zeros(n, dtype=bool)
    joins[1:] = thin[1:] & thin[:-1] & ((start_ns[1:] - end_ns[:-1]) < min_ns)
    heads = np.flatnonzero(~joins)
    tails = np.append(heads[1:], n) - 1
    return (
        start_ns[heads],
        np.maximum.reduceat(end_ns, heads),
        owner[heads],
        owner[tails],
        np.diff(np.append(heads, n)),
    )


def lane_bars(
    records: Sequence[StepRecord],
    start_ns: int | None = None,
    end_ns: int | None = None,
    min_ns: float = 0.0,
    lanes: Sequence[str] = LANES,
) -> dict[str, LaneBars]:
    """Group every span by lane (in ``lanes`` order), clip to the window, merge thin runs.

    Spans entirely outside ``[start_ns, end_ns]`` are dropped; spans crossing an edge are
    clipped to it. Lanes with no span are present with empty arrays, so every lane keeps
    its row. Spans on a lane not in ``lanes`` are ignored (a newer engine may add lanes).
    """
    per_lane: dict[str, tuple[list[int], list[int], list[int]]] = {
        lane: ([], [], []) for lane in lanes
    }
    for i, rec in enumerate(records):
        for span in rec.spans:
            cols = per_lane.get(span.lane)
            if cols is not None:
                cols[0].append(span.start_ns)
                cols[1].append(span.end_ns)
                cols[2].append(i)
    lo = np.iinfo(np.int64).min if start_ns is None else start_ns
    hi = np.iinfo(np.int64).max if end_ns is None else end_ns
    out: dict[str, LaneBars] = {}
    for lane, (starts, ends, owners) in per_lane.items():
        s = np.asarray(starts, dtype=np.int64)
        e = np.asarray(ends, dtype=np.int64)
        o = np.asarray(owners, dtype=np.int64)
        keep = (e >= lo) & (s <= hi)
        s, e, o = np.clip(s[keep], lo, hi), np.clip(e[keep], lo, hi), o[keep]
        order = np.argsort(s, kind="stable")
        s, e, o = s[order], e[order], o[order]
        ms, me, mo, ml, mc = merge_thin(s, e, o, min_ns)
        out[lane] = LaneBars(lane, ms, me, mo, ml, mc)
    return out


def step_facts(rec: StepRecord) -> str:
    """The hover text of one step: everything its record says about the batch ("cached":
    prompt tokens of the requests it admitted that the prefix cache held, not computed)."""
    bucket = "eager" if rec.graph_bucket is None else f"graph bucket {rec.graph_bucket}"
    return (
        f"step {rec.step} · {rec.mode} · slot {rec.slot}<br>"
        f"requests {rec.num_requests} · prefill {rec.prefill_tokens} · "
        f"cached {rec.cached_tokens} · decode {rec.decode_tokens} · "
        f"padded {rec.padded_tokens}<br>{bucket}"
    )


def _hover_texts(bars: LaneBars, facts: np.ndarray, records: Sequence[StepRecord]) -> np.ndarray:
    # A fixed-width unicode array, not a list: plotly validates it without a per-item loop.
    dur_ms = (bars.end_ns - bars.start_ns) / 1e6
    texts: list[str] = []
    for k in range(len(bars)):
        if bars.count[k] == 1:
            head = f"<b>{bars.lane}</b> {dur_ms[k]:.3f} ms"
            texts.append(f"{head}<br>{facts[bars.owner[k]]}")
        else:
            first, last = records[bars.owner[k]].step, records[bars.owner_last[k]].step
            texts.append(
                f"<b>{bars.lane}</b> {dur_ms[k]:.3f} ms<br>"
                f"{bars.count[k]} spans merged (thinner than a pixel), steps {first}-{last}"
            )
    return np.array(texts, dtype=str)


STALL_COLOUR = "#d62728"
STALL_ROW = -0.35  # stall marks sit at the top of the first lane's row


def stall_marks(records: Sequence[StepRecord], lo: int, hi: int
                ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The stalls (telemetry/stalls.py) among ``records`` that end within [lo, hi]: each
    one's end and its interval's length in ms relative to ``hi``, and its hover text."""
    ends, lengths, texts = [], [], []
    for rec in records:
        end = rec.end_ns
        if not rec.stall or end is None or not lo <= end <= hi:
            continue
        ends.append((end - hi) / 1e6)
        lengths.append(rec.stall_ns / 1e6)
        texts.append(f"<b>stall: {rec.stall}</b> {rec.stall_ns / 1e6:.1f} ms "
                     f"(usually {rec.stall_baseline_ns / 1e6:.1f} ms)<br>"
                     f"{rec.stall_detail}<br>{step_facts(rec)}")
    return np.array(ends, dtype=float), np.array(lengths, dtype=float), texts


def _stall_trace(records: Sequence[StepRecord], lo: int, hi: int, legend: bool) -> go.Scatter:
    """A mark at each stalled step's end, its interval drawn back to the step before it."""
    x, length, texts = stall_marks(records, lo, hi)
    return go.Scatter(
        x=x, y=np.full(len(x), STALL_ROW), mode="markers", name="stall (cause on hover)",
        marker={"symbol": "triangle-down", "size": 11, "color": STALL_COLOUR},
        error_x={"type": "data", "symmetric": False, "array": np.zeros(len(x)),
                 "arrayminus": length, "color": STALL_COLOUR, "thickness": 2, "width": 0},
        hovertext=texts, hoverinfo="text", showlegend=legend,
    )


FADED_OPACITY = 0.18  # spans of other steps, while one request's steps are highlighted


def bar_opacity(bars: LaneBars, lit: np.ndarray) -> np.ndarray:
    """Per bar: 1 where its step (for a merged bar, its first or last step) is lit, else
    FADED_OPACITY."""
    on = lit[bars.owner] | lit[bars.owner_last] if len(bars) else np.zeros(0, dtype=bool)
    return np.where(on, 1.0, FADED_OPACITY)


def legend_height_px(bars: dict[str, LaneBars]) -> int:
    """The height the legend takes: plotly lists only lanes that have a bar, under a title
    per group (CPU, device, a rank's lanes)."""
    drawn = [lane for lane, b in bars.items() if len(b)]
    groups = {lane_group(lane) for lane in drawn}
    return (len(drawn) + len(groups)) * LEGEND_ROW_PX + max(len(groups) - 1, 0) * (
        LEGEND_GROUP_GAP_PX)


def timeline_figure(
    records: Sequence[StepRecord],
    *,
    window_ms: float | None = None,
    end_ns: int | None = None,
    start_ns: int | None = None,
    width_px: int = DEFAULT_WIDTH_PX,
    height_px: int = 360,
    title: str | None = None,
    legend: bool = True,
    uirevision: str | None = None,
    x_title: str = "ms before the newest span",
    highlight_steps: Collection[int] | None = None,
) -> go.Figure:
    """A Gantt chart of ``records``: one row per lane (LANES order, top to bottom).

    The x axis is milliseconds before ``end_ns`` (default: the latest span end). With
    ``window_ms`` only that much history is drawn and the axis is exactly
    ``[-window_ms, 0]``, so a live chart keeps one range (and, with ``uirevision``, the
    user's zoom) from refresh to refresh. ``start_ns`` without ``window_ms`` draws from
    there. Spans thinner than one pixel of a ``width_px`` wide plot are merged (see
    merge_thin). ``legend`` adds one entry per lane with its meaning, grouped CPU / device,
    and makes the figure taller than ``height_px`` where the legend needs it (a legend
    taller than its plot scrolls). ``highlight_steps`` (step numbers: one request's, from
    the Requests page) draws their spans at full strength and every other span faded.
    """
    if width_px < 1:
        raise ValueError(f"width_px must be >= 1, got {width_px}")
    if window_ms is not None and window_ms <= 0:
        raise ValueError(f"window_ms must be > 0, got {window_ms}")
    if end_ns is None:
        end_ns = window_end_ns(records)
    first_start = min((s.start_ns for r in records for s in r.spans), default=None)
    if end_ns is None or first_start is None:
        lo = hi = end_ns or 0
    elif window_ms is not None:
        lo, hi = end_ns - int(window_ms * 1e6), end_ns
    else:
        lo, hi = (first_start if start_ns is None else start_ns), end_ns
    px_ns = max(hi - lo, 1) / width_px
    lanes = lanes_of(records)
    bars = lane_bars(records, lo, hi, min_ns=px_ns, lanes=lanes)
    facts = np.array([step_facts(r) for r in records] or [""], dtype=object)
    lit = None
    if highlight_steps is not None:
        wanted = set(highlight_steps)
        lit = np.array([r.step in wanted for r in records] or [False], dtype=bool)

    fig = go.Figure()
    for lane in lanes:
        lb = bars[lane]
        group = lane_group(lane)
        fig.add_trace(
            go.Bar(
                orientation="h",
                name=legend_name(lane),
                legendgroup=group,
                legendgrouptitle={"text": group},
                # Numeric rows (0 = top lane), labelled by tickvals: category strings would
                # make plotly validate every bar one by one.
                y=np.full(len(lb), float(lane_row(lane, lanes))),
                base=(lb.start_ns - hi) / 1e6,
                # A span is at least a pixel wide on screen, or a 3 µs launch would vanish.
                x=np.maximum((lb.end_ns - lb.start_ns), px_ns) / 1e6,
                marker={"color": LANE_COLOURS.get(lane) or rank_lane_colour(lane),
                        "line": {"width": 0},
                        **({} if lit is None else {"opacity": bar_opacity(lb, lit)})},
                hovertext=_hover_texts(lb, facts, records),
                hoverinfo="text",
                showlegend=legend,
            )
        )
    # Stalls: a mark on each flagged step, its cause on hover (no trace while there is none).
    stalls = _stall_trace(records, lo, hi, legend)
    if len(stalls.x):
        fig.add_trace(stalls)
    if window_ms is not None:
        x_range = [-float(window_ms), 0.0]
    else:
        x_range = [(lo - hi) / 1e6, 0.0] if hi != lo else [-1.0, 0.0]
    n_cpu = sum(1 for lane in lanes if lane_group(lane) == CPU_GROUP)
    top = 30 if title else 10
    if legend:
        height_px = max(height_px, legend_height_px(bars) + top + 40)
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        height=height_px,
        margin={"l": 10, "r": 10, "t": top, "b": 40},
        title={"text": title, "font": {"size": 14}, "x": 0.01} if title else None,
        hovermode="closest",
        uirevision=uirevision,
        legend={
            "groupclick": "toggleitem",
            "font": {"size": 11},
            "tracegroupgap": LEGEND_GROUP_GAP_PX,
            "itemclick": "toggle",
        },
        xaxis={
            "title": {"text": x_title},
            "range": x_range,
            "zeroline": False,
            "ticksuffix": " ms",
        },
        yaxis={
            "tickmode": "array",
            "tickvals": [float(lane_row(lane, lanes)) for lane in lanes],
            "ticktext": list(lanes),
            "range": [len(lanes) - 0.5, -0.5],  # reversed: the first lane on top
            "fixedrange": True,
            "zeroline": False,
            "automargin": True,
        },
        # One separator between the CPU rows and the device rows.
        shapes=[
            {
                "type": "line",
                "xref": "paper",
                "yref": "y",
                "x0": 0,
                "x1": 1,
                "y0": n_cpu - 0.5,
                "y1": n_cpu - 0.5,
                "line": {"color": "#999999", "width": 1, "dash": "dot"},
            }
        ],
    )
    if not any(len(b) for b in bars.values()):
        fig.add_annotation(
            text="no steps yet: submit a prompt or start the load generator",
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
            showarrow=False,
        )
    return fig
