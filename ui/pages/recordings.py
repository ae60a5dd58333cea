"""Recordings page: open a telemetry recording in the same timeline, figures and A/B view.

Owns choosing a recording (one shipped in docs/recordings/, or a JSON-lines file uploaded
from the engine's exporter), saying where it was made, and drawing it: one row of figures
per mode (decode-only steps, prefill apart), the slots its steps used, and the A/B view of
two of its modes, whose verdict's interval is a block bootstrap of the decode-only steps (one
run per mode). Needs no engine: it opens with the engine stopped, hung or on another machine.

It must never write a recording, and never run anything a file contains (ui/figures/recordings.py
reads plain JSON values only).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from telemetry.verdict import decode_steps
from ui.figures.ab import Window
from ui.figures.recordings import Recording, list_recordings, load_recording, parse_recording
from ui.figures.window_stats import window_stats
from ui.widgets.ab_view import show_ab
from ui.widgets.prefill_tax import prefill_tax_recording
from ui.widgets.slots import slots_view

PICK_KEY = "rec.pick"
UPLOAD_KEY = "rec.upload"


@st.cache_data(max_entries=8, show_spinner="Reading the recording...")
def cached_recording(path: str, mtime: float) -> Recording:
    return load_recording(path)


def mode_rows(rec: Recording) -> list[dict]:
    """One row per mode: decode-only figures (what the verdict compares), prefill apart, and
    the window's step period and CPU work."""
    rows = []
    for label, steps in rec.by_mode().items():
        s = window_stats(steps, label)
        d = decode_steps(steps)
        rows.append({
            "mode": label, "steps": s.steps, "seconds": round(s.duration_s, 3),
            "decode steps": d.n, "decode tokens/s": round(d.tokens_per_s, 1),
            "busy %": round(100 * d.busy, 1),
            "prefill steps": d.prefill_steps, "prompt tokens": d.prefill_tokens,
            "prefill ms": round(d.prefill_ns / 1e6, 1),
            "step ms": round(s.step_ms, 3), "CPU ms": round(s.cpu_ms, 3),
            "CPU %": round(100 * s.cpu_share, 1),
        })
    return rows


# Short headers, said in full on hover: thirteen long ones did not fit 1280 px ("CPU sh...").
MODE_COLUMNS = {
    "decode steps": st.column_config.NumberColumn(
        help="Decode-only steps (no prefill token): what throughput and busy are over."),
    "busy %": st.column_config.NumberColumn(
        format="%.1f", help="Compute busy on the decode-only steps (% of their time)."),
    "step ms": st.column_config.NumberColumn(format="%.3f", help="Median step period."),
    "CPU ms": st.column_config.NumberColumn(
        format="%.3f", help="Median CPU work per step (schedule + prepare + launch + post)."),
    "CPU %": st.column_config.NumberColumn(format="%.1f", help="CPU work's share of a step."),
}


def pick() -> Recording | None:
    shipped = list_recordings()
    options = [p.name for p in shipped]
    col_pick, col_up = st.columns([2, 1])
    with col_pick:
        name = st.selectbox("Shipped recordings (docs/recordings/)", options, key=PICK_KEY,
                            index=0 if options else None,
                            placeholder="none shipped yet")
    with col_up:
        upload = st.file_uploader("…or open a JSON-lines export", type=["jsonl"],
                                  key=UPLOAD_KEY)
    try:
        if upload is not None:
            text = upload.getvalue().decode("utf-8", errors="replace")
            return parse_recording(text.splitlines(), name=Path(upload.name).stem)
        if name:
            path = next(p for p in shipped if p.name == name)
            return cached_recording(str(path), path.stat().st_mtime)
    except ValueError as exc:
        st.error(f"This file is not a recording: {exc}")
    return None


def main() -> None:
    st.title("Recordings")
    st.caption(
        "A recording is the engine's telemetry as JSON lines (telemetry/export.py), made with "
        "`python -m bench record-timeline`: every step's spans, one mode after another. It opens "
        "here without an engine, so a machine with no GPU shows what each mode does on one. "
        "Throughput and busy are over decode-only steps; prefill is reported apart. A "
        "recording holds one run per mode, so the verdict's 95% interval comes from a block "
        "bootstrap of those decode-only steps."
    )
    rec = pick()
    if rec is None:
        return
    meta = rec.meta
    st.markdown(f"**{rec.title()}**" + (f" · {meta['model']}" if meta.get("model") else ""))
    st.dataframe(mode_rows(rec), hide_index=True, key="rec.modes", column_config=MODE_COLUMNS,
                 placeholder="–")
    slots_view(rec.steps, key="rec.slots", table=True)
    windows = rec.by_mode()
    prefill_tax_recording(windows, key="rec.prefill_tax")
    labels = list(windows)
    if len(labels) < 2:
        st.info(f"This recording holds one mode ({labels[0]}): its timeline is below.")
        steps = windows[labels[0]]
        show_ab(Window(labels[0], steps), Window(labels[0], steps), key="rec.single",
                judge=False)
        return
    a_col, b_col = st.columns(2)
    a = a_col.selectbox("A", labels, index=0, key="rec.a")
    b = b_col.selectbox("B", labels, index=1, key="rec.b")
    show_ab(Window(a, windows[a]), Window(b, windows[b]), key="rec.ab")


main()
