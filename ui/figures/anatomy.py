"""Step anatomy figures: one recorded step as a kernel timeline, and the family table.

Owns turning an anatomy summary (engine.instruments.anatomy.anatomy_summary's plain dict: per-step
timing, kernel families, a compact Chrome trace with one row per family) into rows and a
plotly figure, and reading the shipped GPU anatomy (``python -m bench anatomy``'s JSON in
docs/recordings/) that the page shows where there are no kernels to record (a CPU). Pure
functions: no streamlit, no engine, no clock reads; it never writes a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from telemetry.floor import renamed_floor_keys
from telemetry.kernel_family import colour_of

# The 8B decode-step anatomy written by `python -m bench anatomy`; its meta says where and when.
SHIPPED_ANATOMY = (Path(__file__).resolve().parents[2] / "docs" / "recordings"
                   / "anatomy-h200-llama-8b.json")


def load_shipped_anatomy(path: Path = SHIPPED_ANATOMY) -> dict[str, Any] | None:
    """The bench anatomy document (meta + results), or None when it is not there. A document
    written under the separate-kernel reference's former key names reads as the present ones."""
    try:
        with path.open(encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    return renamed_floor_keys(doc) if isinstance(doc, dict) and doc.get("results") else None


def shipped_caption(doc: Mapping[str, Any]) -> str:
    m = doc.get("meta", {})
    return (f"`{m.get('command', 'python -m bench anatomy')}` on {m.get('device', '?')}, "
            f"commit {m.get('commit', '?')}, {m.get('date', '?')}")


def shipped_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (implementation, batch): kernels a step, first to last kernel, time
    inside kernels, the byte floor (the limit) and, where the document has one, the
    separate-kernel reference (what separate cold reads of each size cost: no limit)."""
    res = doc.get("results", {})
    shapes = res.get("shapes", {})
    rows = []
    for r in res.get("results", []):
        shape = shapes.get(str(r.get("batch")), {})
        floor, ref = shape.get("floor_us"), shape.get("separate_kernel_reference_us")
        span = float(r.get("span_us", 0.0))
        row = {
            "implementation": r.get("impl"), "batch": r.get("batch"),
            "kernels/step": round(sum(f["count"] for f in r.get("families", {}).values())),
            "first to last kernel (us)": round(span, 1),
            "inside kernels (us)": round(float(r.get("kernel_busy_us", 0.0)), 1),
            "byte floor (us)": None if floor is None else round(float(floor), 1),
            "x floor": None if not floor else round(span / float(floor), 2),
        }
        if ref:
            row["separate-kernel reference (us)"] = round(float(ref), 1)
            row["x separate-kernel reference"] = round(span / float(ref), 2)
        rows.append(row)
    return rows


def shipped_family_rows(doc: Mapping[str, Any], impl: str, batch: int) -> list[dict[str, Any]]:
    """The family table of one shipped result, biggest time first."""
    for r in doc.get("results", {}).get("results", []):
        if r.get("impl") == impl and r.get("batch") == batch:
            fams = r.get("families", {})
            total = sum(f["us"] for f in fams.values()) or 1.0
            return sorted(({"family": name, "kernels/step": round(f["count"], 1),
                            "time/step (us)": round(f["us"], 1),
                            "share %": round(100 * f["us"] / total, 1)}
                           for name, f in fams.items()),
                          key=lambda row: -row["time/step (us)"])
    return []


def family_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The family table for display: per-step means, biggest time first."""
    return [{"family": f["family"], "kernels/step": round(f["count"], 1),
             "time/step (us)": round(f["time_us"], 1), "share %": round(100 * f["share"], 1)}
            for f in summary.get("families", [])]


NOT_MEASURED = "not measured"


def step_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per recorded step, in step order: first kernel to last, time inside kernels,
    gaps between them. A recorded step the profiler did not fully measure has its timings
    left empty and a "measured" column saying "not measured" and why, never a gap that
    would read as idle."""
    unmeasured = summary.get("not_measured") or []
    rows = []
    for s in summary.get("steps", []):
        row = {"step": s["step"], "kernels": s["kernels"],
               "first to last kernel (us)": round(s["span_us"], 1),
               "inside kernels (us)": round(s["kernel_us"], 1),
               "between kernels (us)": round(s["gap_us"], 1)}
        if "times_floor" in s:
            row["x byte floor"] = round(s["times_floor"], 2)
        # The floor and the reference from the engine's start-up curve
        # (engine/instruments/step_floor.py), on a GPU
        for key, label in (("x_peak_floor", "x peak-copy floor"),
                           ("x_separate_kernel_reference", "x separate-kernel reference")):
            if s.get(key) is not None:
                row[label] = round(s[key], 2)
        if unmeasured:
            row["measured"] = "yes"
        rows.append(row)
    for u in unmeasured:
        rows.append({"step": u["step"], "kernels": None, "first to last kernel (us)": None,
                     "inside kernels (us)": None, "between kernels (us)": None,
                     "measured": f"{NOT_MEASURED}: {u['why']}"})
    return sorted(rows, key=lambda r: r["step"])


def step_timeline_figure(summary: Mapping[str, Any], step: int,
                         height_px: int = 380) -> go.Figure:
    """The kernels of ``step``: one row per family, microseconds from its first kernel.
    Raises ValueError when the summary holds no kernels for that step."""
    events = summary.get("trace", {}).get("traceEvents", [])
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    mine = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("step") == step]
    if not mine:
        recorded = [s["step"] for s in summary.get("steps", [])]
        why = {u["step"]: u["why"] for u in summary.get("not_measured") or []}.get(step)
        if why is not None:
            raise ValueError(f"step {step} was {NOT_MEASURED}: {why}; measured steps: "
                             f"{recorded}")
        raise ValueError(f"no kernels recorded for step {step}; recorded steps: {recorded}")
    t0 = min(e["ts"] for e in mine)
    fig = go.Figure()
    for tid in sorted({e["tid"] for e in mine}):
        fam = [e for e in mine if e["tid"] == tid]
        family = names.get(tid, str(tid))
        fig.add_trace(go.Bar(
            orientation="h", name=family, y=[family] * len(fam),
            base=np.array([e["ts"] - t0 for e in fam]), x=np.array([e["dur"] for e in fam]),
            marker={"color": colour_of(family), "line": {"width": 0}},
            hovertext=[f"{e['name'][:80]}<br>{e['dur']:.2f} us" for e in fam],
            hoverinfo="text",
        ))
    fig.update_layout(
        title=f"Step {step}: {len(mine)} kernels",
        barmode="overlay", height=height_px, showlegend=False,
        xaxis={"title": "us from the step's first kernel"},
        margin={"l": 90, "r": 20, "t": 40, "b": 40},
    )
    return fig
