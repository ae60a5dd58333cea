"""Slots, seen: which slot each step used, how long its inputs waited on the device, how long
the CPU waited for a free slot, and where async mode read a step alone, and why.

Owns the per-slot summary, mode by mode (steps, input wait p50/p99, the CPU's slot wait, steps
read alone by reason) and one figure: the steps on their slots, step by step, with the steps
read alone marked by reason, beside each slot's input wait distribution. The facts are the
step records' (slot, slot_wait_ns, sync_fallback, input_wait_ns: telemetry/records.py). A
sync step is drawn as sync, never as a fallback: sync mode reads every step before the next
by design. Pure functions: no streamlit, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go

from telemetry.records import StepRecord, SyncFallback

SLOT_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd")
SYNC_COLOR = "#9e9e9e"
FALLBACK_COLOR = "#d62728"
FALLBACK_SYMBOLS: dict[SyncFallback, str] = {
    SyncFallback.SINGLE_SLOT: "x",
    SyncFallback.NOTHING_SCHEDULED: "circle-open",
    SyncFallback.PREEMPTION: "triangle-up",
    SyncFallback.LIVE_SETTINGS: "diamond",
    SyncFallback.SHUTDOWN: "square",
}
# What each reason means to someone reading the chart (the engine's words are the enum's).
FALLBACK_MEANING: dict[SyncFallback, str] = {
    SyncFallback.SINGLE_SLOT: "one slot: the step is read before the next may reuse it",
    SyncFallback.NOTHING_SCHEDULED: "nothing could run before its results (a burst's end)",
    SyncFallback.PREEMPTION: "the work left waits for a preempted request's token",
    SyncFallback.LIVE_SETTINGS: "a live-settings change drains the pipeline",
    SyncFallback.SHUTDOWN: "the engine stopped",
}


@dataclass(slots=True)
class SlotSummary:
    """One slot's steps of one mode in a window of records (a sync step's inputs wait for
    nothing but the copy, an async step's for the step before it: kept apart)."""

    slot: int
    mode: str
    steps: int = 0
    input_wait_ns: list[int] = field(default_factory=list)
    slot_wait_ns: int = 0  # total: the CPU waited for this slot to come free
    slot_waits: int = 0  # steps whose CPU waited for it at all
    fallbacks: dict[SyncFallback, int] = field(default_factory=dict)

    def input_wait_ms(self, q: float) -> float | None:
        """The q-quantile (0..1) of the input wait, ms; None without timed steps."""
        if not self.input_wait_ns:
            return None
        return float(np.quantile(np.asarray(self.input_wait_ns), q)) / 1e6


def fallback_of(rec: StepRecord) -> SyncFallback | None:
    """The step's reason as a SyncFallback (a recording read back may hold its plain value)."""
    value = rec.sync_fallback
    return None if value is None else SyncFallback(value)


def slot_summaries(records: Sequence[StepRecord]) -> list[SlotSummary]:
    """One summary per slot and mode the records used, by slot index, async first."""
    out: dict[tuple[int, str], SlotSummary] = {}
    for rec in records:
        key = (rec.slot, rec.mode)
        s = out.get(key)
        if s is None:
            s = out[key] = SlotSummary(rec.slot, rec.mode)
        s.steps += 1
        wait = rec.input_wait_ns
        if wait is not None:
            s.input_wait_ns.append(wait)
        if rec.slot_wait_ns:
            s.slot_wait_ns += rec.slot_wait_ns
            s.slot_waits += 1
        reason = fallback_of(rec)
        if reason is not None:
            s.fallbacks[reason] = s.fallbacks.get(reason, 0) + 1
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1] != "async"))]


def fallback_counts(records: Sequence[StepRecord]) -> dict[SyncFallback, int]:
    """Steps read alone, by reason, in SyncFallback's order; reasons never seen left out."""
    counts = {reason: 0 for reason in SyncFallback}
    for rec in records:
        reason = fallback_of(rec)
        if reason is not None:
            counts[reason] += 1
    return {k: v for k, v in counts.items() if v}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def slot_rows(summaries: Sequence[SlotSummary]) -> list[dict[str, Any]]:
    """Table rows, one per slot and mode (times in ms)."""
    return [{
        "slot": s.slot,
        "mode": s.mode,
        "steps": s.steps,
        "input wait p50 ms": _ms(s.input_wait_ms(0.5)),
        "input wait p99 ms": _ms(s.input_wait_ms(0.99)),
        "CPU waited for it": s.slot_waits,
        "CPU wait ms": round(s.slot_wait_ns / 1e6, 3),
        "read alone": ", ".join(f"{n} {reason}" for reason, n in s.fallbacks.items()) or "–",
    } for s in summaries]


def slots_title(records: Sequence[StepRecord]) -> str:
    slots = len({r.slot for r in records})
    counts = fallback_counts(records)
    alone = ", ".join(f"{n} {reason}" for reason, n in counts.items())
    head = f"{len(records)} steps on {slots} slot{'s' if slots != 1 else ''}"
    return f"{head} · read alone: {alone}" if counts else f"{head} · none read alone"


def _hovertemplate(mode: str, reason: SyncFallback | None) -> str:
    """One trace's hover (per point: step, slot, input wait and slot wait from customdata)."""
    lines = ["step %{x} · slot %{y} · " + mode,
             "inputs waited %{customdata[0]:.3f} ms",
             "CPU waited %{customdata[1]:.3f} ms for the slot"]
    if reason is not None:
        lines.append(f"read alone: {reason} ({FALLBACK_MEANING[reason]})")
    return "<br>".join(lines) + "<extra></extra>"


LEFT_DOMAIN = (0.0, 0.62)
RIGHT_DOMAIN = (0.67, 1.0)


def slots_figure(records: Sequence[StepRecord], *, height_px: int = 260,
                 uirevision: str | None = None) -> go.Figure:
    """Left: every step on its slot (x: step number); async steps in their slot's colour,
    sync steps grey, steps read alone marked by reason. Right: each slot's input wait (ms).
    Built in one go (axes laid out by hand, no make_subplots): plotly's per-call updates cost
    more than the data on a long recording."""
    # per group: steps, slots, input wait (ms, NaN where unknown), slot wait (ms), mode
    groups: dict[Any, tuple[list[int], list[int], list[float], list[float], set[str]]] = {}
    for rec in records:
        reason = fallback_of(rec)
        group: Any = reason if reason is not None else ("sync" if rec.mode == "sync"
                                                        else rec.slot)
        steps, slot_of, waits, slot_waits, modes = groups.setdefault(
            group, ([], [], [], [], set()))
        steps.append(rec.step)
        slot_of.append(rec.slot)
        wait = rec.input_wait_ns
        waits.append(np.nan if wait is None else wait / 1e6)
        slot_waits.append(rec.slot_wait_ns / 1e6)
        modes.add(rec.mode)
    slots = sorted({r.slot for r in records})
    data: list[dict[str, Any]] = []

    def strip(group: Any, name: str, marker: dict[str, Any]) -> None:
        if group in groups:
            steps, slot_of, waits, slot_waits, modes = groups[group]
            mode = "/".join(sorted(modes))
            data.append(dict(
                type="scattergl", x=np.asarray(steps), y=np.asarray(slot_of), mode="markers",
                name=name, customdata=np.column_stack([waits, slot_waits]), marker=marker,
                hovertemplate=_hovertemplate(mode, group if isinstance(group, SyncFallback)
                                             else None)))

    for slot in slots:
        strip(slot, f"slot {slot}", dict(color=SLOT_COLORS[slot % len(SLOT_COLORS)], size=6))
    strip("sync", "sync step", dict(color=SYNC_COLOR, size=6))
    for reason in SyncFallback:
        n = len(groups[reason][0]) if reason in groups else 0
        strip(reason, f"read alone: {reason} ({n})",
              dict(color=FALLBACK_COLOR, size=10, symbol=FALLBACK_SYMBOLS[reason],
                   line=dict(width=2, color=FALLBACK_COLOR)))
    summaries = slot_summaries(records)
    mixed = len({s.mode for s in summaries}) > 1
    for s in summaries:
        if s.input_wait_ns:
            data.append(dict(type="box", x=np.asarray(s.input_wait_ns) / 1e6,
                             name=f"slot {s.slot} · {s.mode}" if mixed else f"slot {s.slot}",
                             boxpoints=False, orientation="h",
                             marker=dict(color=SYNC_COLOR if s.mode == "sync" else
                                         SLOT_COLORS[s.slot % len(SLOT_COLORS)]),
                             showlegend=False, hoverinfo="x", xaxis="x2", yaxis="y2"))
    titles = [dict(text=text, x=sum(domain) / 2, y=1.0, xref="paper", yref="paper",
                   xanchor="center", yanchor="bottom", showarrow=False, font=dict(size=14))
              for text, domain in (("Each step (x: step number) on its slot", LEFT_DOMAIN),
                                   ("Inputs' wait for the device (ms)", RIGHT_DOMAIN))]
    layout = dict(
        title=dict(text=slots_title(records) if records else "No steps yet", x=0,
                   font=dict(size=14)),
        height=height_px, margin=dict(l=60, r=70, t=60, b=10),
        legend=dict(orientation="h", y=-0.15, x=0), uirevision=uirevision,
        annotations=titles,
        xaxis=dict(domain=LEFT_DOMAIN, anchor="y"),
        # margins for the tick labels set by hand: some plotly.js builds leave them out
        yaxis=dict(anchor="x", tickmode="array", tickvals=slots,
                   ticktext=[f"slot {k}" for k in slots],
                   range=[(slots[-1] if slots else 0) + 0.6, -0.6]),
        xaxis2=dict(domain=RIGHT_DOMAIN, anchor="y2", rangemode="tozero"),
        yaxis2=dict(anchor="x2", autorange="reversed", side="right"),
    )
    return go.Figure(dict(data=data, layout=layout))
