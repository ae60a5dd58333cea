"""Step anatomy page: record the kernels of the next N steps and show where a step's time goes.

Owns the page only: a button asks the engine (client.record_anatomy) to profile its next N
steps with torch.profiler, then it shows each step's first-to-last-kernel time against the
time inside kernels, the kernel-family table, one step as a kernel timeline, and a Chrome
trace download. Figures come from ui.anatomy.

It must never record while the user has not asked (a recording slows the engine), and keeps
only the latest recording in the session.
"""

from __future__ import annotations

import json

import streamlit as st

from ui.anatomy import family_rows, step_rows, step_timeline_figure
from ui.client import engine_client, engine_errors, show_flashes

RESULT_KEY = "anatomy.result"


def main() -> None:
    client = engine_client()
    show_flashes()
    st.title("Step anatomy")
    st.caption(
        "Records the kernels of the engine's next steps with torch.profiler (Kineto), groups "
        "them by the step that launched them, then by family. *Kernel busy* (time inside "
        "kernels) is measured here; the Live page's *step busy* runs from a step's first "
        "kernel to its last. The engine must be serving requests (start the load generator)."
    )
    n = st.number_input("Steps to record", 1, 64, 8, key="anatomy.n")
    if st.button("Record the next steps", key="anatomy.record", icon=":material/biotech:"):
        with engine_errors(client, "Step anatomy"), st.spinner("Recording..."):
            try:
                st.session_state[RESULT_KEY] = client.record_anatomy(int(n), timeout_s=30.0)
            except (TimeoutError, RuntimeError) as e:
                st.error(f"Step anatomy: {e}")
    summary = st.session_state.get(RESULT_KEY)
    if not summary or not summary.get("steps"):
        return
    st.subheader(f"{len(summary['steps'])} steps ({summary['device']})")
    st.dataframe(step_rows(summary), hide_index=True, key="anatomy.steps")
    st.subheader("Kernel families (per step)")
    st.dataframe(family_rows(summary), hide_index=True, key="anatomy.families")
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


main()
