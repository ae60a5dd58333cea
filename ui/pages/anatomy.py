"""Step anatomy page: record the kernels of the next N steps and show where a step's time goes.

Owns the page only: a button asks the engine (client.record_anatomy) to profile its next N
steps with torch.profiler, then it shows each step's first-to-last-kernel time against the
time inside kernels, the kernel-family table, one step as a kernel timeline, and a Chrome
trace download. Figures come from ui.figures.anatomy.

Where there are no kernels (an engine on the CPU) it records nothing and offers nothing to
start: a CPU profile would count every CPU operator as a "kernel" (thousands a step,
families summing past the step's own time); it says so and shows the shipped H200 anatomy
instead. On an idle GPU engine it does not ask for a recording (which would wait out its
timeout for steps that never come): it says to start the load first.

It must never record while the user has not asked (a recording slows the engine), and keeps
only the latest recording in the session.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import streamlit as st

from ui.engine_link import engine_client, engine_errors
from ui.figures.anatomy import (
    SHIPPED_ANATOMY,
    family_rows,
    load_shipped_anatomy,
    shipped_caption,
    shipped_family_rows,
    shipped_rows,
    step_rows,
    step_timeline_figure,
)
from ui.widgets.fragments import run_page

if TYPE_CHECKING:
    from engine.process.client import EngineClient

RESULT_KEY = "anatomy.result"
SCREENSHOT = SHIPPED_ANATOMY.parents[1] / "screenshots" / "anatomy-8b-h200.png"


def show_shipped() -> None:
    """The H200 anatomy shipped in docs/recordings/: what a decode step's kernels look like."""
    doc = load_shipped_anatomy()
    if doc is None:
        st.warning(f"The shipped H200 anatomy is missing ({SHIPPED_ANATOMY.name}).")
        return
    st.subheader("A recorded H200 decode step (Llama-3.1-8B shape, bf16)")
    st.caption(shipped_caption(doc))
    st.dataframe(shipped_rows(doc), hide_index=True, key="anatomy.shipped", placeholder="–")
    st.markdown("**gapless, batch 32: kernel families per step**")
    st.dataframe(shipped_family_rows(doc, "gapless", 32), hide_index=True,
                 key="anatomy.shipped_families", placeholder="–")
    if SCREENSHOT.is_file():
        st.image(str(SCREENSHOT), caption="This page on the H200 (8B shape).")


def engine_idle(client: EngineClient) -> bool:
    """No request in the engine and no load: no step will come to record."""
    stats = client.stats()
    busy = int(stats.get("running", 0)) + int(stats.get("waiting", 0)) + int(
        stats.get("unfinished", 0))
    return busy == 0 and not client.load_running()


def main() -> None:
    client = engine_client()
    st.title("Step anatomy")
    with engine_errors(client, "Reading the engine's settings"):
        device = client.settings().get("device", "cuda")
    st.caption(
        "Records the kernels of the engine's next steps with torch.profiler (Kineto), groups "
        "them by the step that launched them, then by family. *Kernel busy* (time inside "
        "kernels) is measured here; the Live page's *step busy* runs from a step's first "
        "kernel to its last." + (
            " The engine must be serving requests (start the load generator)."
            if device == "cuda" else " It needs an engine on a GPU.")
    )
    if device != "cuda":
        st.info(
            f"This engine runs on the {str(device).upper()}: its steps run no GPU kernels, so "
            "there are none to record here (a CPU profile would count every CPU operator "
            "as a kernel). Below is an anatomy recorded on an H200 and shipped with the "
            "project.", icon=":material/info:")
        show_shipped()
        return
    n = st.number_input("Steps to record", 1, 64, 8, key="anatomy.n")
    if st.button("Record the next steps", key="anatomy.record", icon=":material/biotech:"):
        with engine_errors(client, "Step anatomy"):
            if engine_idle(client):
                st.warning("The engine is idle: no step would come to record. Start the load "
                           "generator on the Live page (or send requests), then record.")
            else:
                with st.spinner("Recording..."):
                    try:
                        st.session_state[RESULT_KEY] = client.record_anatomy(
                            int(n), timeout_s=30.0)
                    except (TimeoutError, RuntimeError) as e:
                        st.error(f"Step anatomy: {e}")
    summary = st.session_state.get(RESULT_KEY)
    unmeasured = (summary or {}).get("not_measured") or []
    if summary and not summary.get("steps") and unmeasured:
        st.warning(f"None of the {len(unmeasured)} recorded steps was measured (the profiler "
                   f"kept no complete kernel record: {unmeasured[0]['why']}); record again.")
    if not summary or not summary.get("steps"):
        return
    st.subheader(f"{len(summary['steps'])} steps ({summary['device']})"
                 + (f", {len(unmeasured)} not measured" if unmeasured else ""))
    st.dataframe(step_rows(summary), hide_index=True, key="anatomy.steps", placeholder="–")
    st.subheader("Kernel families (per step)")
    st.dataframe(family_rows(summary), hide_index=True, key="anatomy.families",
                 placeholder="–")
    steps = [s["step"] for s in summary["steps"]]
    step = st.selectbox("Step", steps, index=len(steps) // 2, key="anatomy.step")
    st.plotly_chart(step_timeline_figure(summary, step), key="anatomy.timeline")
    st.download_button(
        "Download the Chrome trace (one row per family)",
        data=json.dumps(summary["trace"]),
        file_name=f"gapless-anatomy-{steps[0]}-{steps[-1]}.json",
        mime="application/json", key="anatomy.trace", on_click="ignore",
        help="Open it in Perfetto (ui.perfetto.dev). The full Kineto trace is on the engine's "
             f"machine: {summary.get('trace_path')}",
    )


run_page(main)
