"""Diff page: two runs diffed step by step, with what they do not share said first.

Owns picking the two runs of one browser tab: each side a window of a shipped recording
(docs/recordings/), of a JSON-lines file opened here, or of the live engine (a capture of
the next few seconds of its steps), and drawing their diff (telemetry/run_diff.py; figures
ui/figures/run_diff.py): what is not comparable (device, model, mode, graphs, batch sizes),
the decode verdict with its 95% interval (telemetry/verdict.py, the A/B page's), step times
by kind and batch size, the floor-to-wall waterfall and kernel families side by side.
Recordings need no engine: the page opens with the engine stopped or on another machine.

It must never write a recording or change the engine's settings (a capture only reads the
telemetry bus), and never run anything a file contains.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.records import StepRecord
from telemetry.run_diff import Run, diff_runs, recording_facts
from ui.figures.recordings import Recording, list_recordings, load_recording, parse_recording
from ui.figures.run_diff import (
    facet_rows,
    family_figure,
    family_note,
    group_rows,
    step_time_figure,
    waterfall_figure,
)
from ui.widgets.fragments import run_page

if TYPE_CHECKING:
    from streamlit.delta_generator import DeltaGenerator

LIVE = "live engine (capture)"
ALL_STEPS = "all steps"
DEFAULT = ("h200-llama-1b.jsonl", 0, 1)  # the shipped sync and async windows of one run
UPLOADS_KEY = "diff.uploads"
CAPTURES_KEY = "diff.captures"
CAPTURE_S = 3.0
CHART_CONFIG = {"displaylogo": False}


@dataclass(slots=True)
class Side:
    """What one side picked: the run to diff, and where it came from (for its label)."""

    source: str
    window: str
    run: Run | None


@st.cache_data(max_entries=8, show_spinner="Reading the recording...")
def cached_recording(path: str, mtime: float) -> Recording:
    return load_recording(path)


def recording_named(name: str) -> Recording | None:
    uploads: dict[str, Recording] = st.session_state.setdefault(UPLOADS_KEY, {})
    if name in uploads:
        return uploads[name]
    path = next((p for p in list_recordings() if p.name == name), None)
    return cached_recording(str(path), path.stat().st_mtime) if path else None


def live_facts() -> dict[str, str]:
    """The live engine's device and model, as the Diff's facts. A CPU is named as
    `python -m bench record-timeline` names it in a recording (the engine runs on this
    machine); a GPU by its device type only, as the engine's settings give it."""
    from ui.engine_link import engine_client  # only a live capture needs the engine

    s = engine_client().settings()
    device = str(s.get("device", ""))
    if device == "cpu":
        device = f"CPU ({platform.processor() or platform.machine()})"
    return {"device": device, "model": f"{s.get('model', '')} ({s.get('dtype', '')})",
            "workload": "live load"}


def capture(seconds: float) -> list[StepRecord]:
    """The steps the live engine publishes during the next ``seconds``."""
    from ui.engine_link import engine_client

    reader = engine_client().telemetry().reader(from_now=True)
    time.sleep(seconds)
    return [r for r in reader.steps() if r.spans]


def pick_side(key: str, col_source: DeltaGenerator, col_window: DeltaGenerator,
              default_window: int) -> Side:
    uploads: dict[str, Recording] = st.session_state.setdefault(UPLOADS_KEY, {})
    names = [p.name for p in list_recordings()] + list(uploads) + [LIVE]
    default = names.index(DEFAULT[0]) if DEFAULT[0] in names else 0
    source = col_source.selectbox(f"{key}: run", names, index=default, key=f"diff.{key}.source")
    if source == LIVE:
        captures: dict[str, tuple[float, list[StepRecord], dict[str, str]]] = \
            st.session_state.setdefault(CAPTURES_KEY, {})
        with col_window:
            st.write("")  # the button level with the selectbox beside it
            if st.button(f"Capture {key} ({CAPTURE_S:g} s)", key=f"diff.{key}.capture",
                         help="The live engine's steps over the next few seconds: start "
                         "the load (Live page) first, and change a setting between A and B."):
                with st.spinner(f"Capturing {CAPTURE_S:g} s of steps..."):
                    captures[key] = (time.time(), capture(CAPTURE_S), live_facts())
        if key not in captures:
            return Side(source, "", None)
        at, records, facts = captures[key]
        clock = time.strftime("%H:%M:%S", time.localtime(at))
        modes = "/".join(dict.fromkeys(r.mode for r in records)) or "no steps"
        return Side(source, f"capture at {clock}", Run(f"live {modes} {clock}", records, facts))
    rec = recording_named(source)
    if rec is None:
        return Side(source, "", None)
    windows = rec.by_mode()
    labels = [*windows, ALL_STEPS] if len(windows) > 1 else list(windows)
    index = min(default_window, len(labels) - 1) if source == DEFAULT[0] else 0
    window = col_window.selectbox(f"{key}: window", labels, index=index,
                                  key=f"diff.{key}.window.{source}")
    records = rec.steps if window == ALL_STEPS else windows[window]
    return Side(source, window, Run(window, records, recording_facts(rec.meta)))


def open_file() -> None:
    """A JSON-lines recording opened here joins the runs both sides can pick."""
    uploads: dict[str, Recording] = st.session_state.setdefault(UPLOADS_KEY, {})
    with st.expander("Open a JSON-lines recording (the engine's exporter)"):
        upload = st.file_uploader("Recording", type=["jsonl"], key="diff.upload",
                                  label_visibility="collapsed")
        if upload is None:
            return
        name = f"{Path(upload.name).stem} (opened)"
        if name in uploads:
            return
        try:
            text = upload.getvalue().decode("utf-8", errors="replace")
            uploads[name] = parse_recording(text.splitlines(), name=Path(upload.name).stem)
        except ValueError as exc:
            st.error(f"This file is not a recording: {exc}")
            return
        st.rerun()  # the pickers above list it now


def label_runs(a: Side, b: Side) -> None:
    """Name each run by its window, and by its source too where the sources differ."""
    if a.run is None or b.run is None or a.source == b.source:
        return
    for side in (a, b):
        assert side.run is not None
        if side.source != LIVE:
            side.run.label = f"{Path(side.source).stem} {side.window}"


def main() -> None:
    show_diff()
    open_file()


def show_diff() -> None:
    st.title("Diff")
    st.caption(
        "Two runs step by step: two windows of one recording, two recordings, or two "
        "captures of the live engine. Step times by kind and batch size, the floor-to-wall "
        "waterfall and kernel families side by side; differences carry the A/B verdict's "
        "95% interval. What the two runs do not share is said first."
    )
    c = st.columns([3, 2, 3, 2])
    a = pick_side("A", c[0], c[1], DEFAULT[1])
    b = pick_side("B", c[2], c[3], DEFAULT[2])
    if a.run is None or b.run is None:
        st.info("Pick a run on each side (a live capture: click its Capture button).")
        return
    if a.source == b.source and a.window == b.window:
        st.info("A and B are the same window: pick another window or run for one side.")
        return
    label_runs(a, b)
    try:
        diff = diff_runs(a.run, b.run)
    except ValueError as exc:
        st.error(f"Cannot diff: {exc}")
        return
    for note in diff.notes:
        (st.warning if note.serious else st.caption)(note.text)
    # Across devices or models the verdict still reads, but as each run's own figures.
    apart = any(n.serious for n in diff.notes)
    (st.success if diff.decode.measurable and not apart else st.info)(
        diff.decode.text, icon=":material/compare:")
    st.plotly_chart(step_time_figure(diff), key="diff.steps", config=CHART_CONFIG)
    st.dataframe(group_rows(diff.groups), hide_index=True, key="diff.groups", placeholder="–")
    st.plotly_chart(waterfall_figure(diff), key="diff.waterfall", config=CHART_CONFIG)
    fam = family_figure(diff)
    if fam is not None:
        st.plotly_chart(fam, key="diff.families", config=CHART_CONFIG)
    else:
        st.caption(family_note(diff))
    with st.expander("What each run is (device, model, workload, settings)", expanded=True):
        st.dataframe(facet_rows(diff), hide_index=True, key="diff.facets")


run_page(main)
