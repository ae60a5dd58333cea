"""The A/B view: two windows of steps (two modes) side by side on one time scale.

Owns ``show_ab``, which the A/B page (live captures) and the Recordings page (a recording's
modes) both draw: a verdict in plain words on decode-only steps with its 95% interval
(telemetry.verdict), prefill apart, each side's figures (ui/figures/ab.py), and both
timelines over the same span of milliseconds. It must never call the engine: it is handed
records.
"""

from __future__ import annotations

import streamlit as st

from telemetry.verdict import decode_steps, decode_verdict, pooled
from ui.figures.ab import (
    DRAWN,
    SPANS_MS,
    Window,
    ab_figure,
    cpu_note,
    judged_scope,
    short_ms,
    side_header,
)
from ui.figures.timeline import timeline_figure
from ui.figures.window_stats import window_stats


def show_ab(a: Window, b: Window, *, key: str, judge: bool = True) -> None:
    """Verdict, figures side by side, and both timelines over one span of milliseconds.
    ``judge=False`` leaves the verdict out (one window shown twice has nothing to judge)."""
    try:
        sa = window_stats(a.records, a.label, a.start_ns, a.end_ns)
        sb = window_stats(b.records, b.label, b.start_ns, b.end_ns)
    except ValueError as exc:
        st.error(f"Cannot compare: {exc}")
        return
    tput = None
    if judge:
        v = decode_verdict(a.all_runs(), b.all_runs(), a_label=a.label, b_label=b.label)
        (st.success if v.measurable else st.info)(v.text, icon=":material/compare:")
        st.caption(cpu_note(sa, sb))
        tput = v.throughput
    decode = [[decode_steps(r) for r in w.all_runs()] for w in (a, b)]
    cols = st.columns(2)
    tps = []
    for col, s, runs in zip(cols, (sa, sb), decode, strict=True):
        n = sum(r.n for r in runs)
        rate, busy = pooled(runs)
        tps.append(rate)
        judged = judged_scope(len(runs))
        with col:
            st.markdown(side_header(s, n, len(runs)))
            # Two by two: four tiles in half a 1280 px page cut "23.43 ms" to "23.43...".
            m = [c for _ in range(2) for c in st.columns(2)]
            m[0].metric("decode tokens/s", f"{rate:,.1f}",
                        help=f"Decode-only steps of {judged}: their tokens over their "
                        "periods.")
            m[1].metric("step period", short_ms(s.step_ms),
                        help=f"Median step period of {DRAWN}: {s.step_ms:,.3f} ms.")
            m[2].metric("compute busy (decode)", f"{100 * busy:.1f}%",
                        help=f"Share of the decode-only steps' time with a compute span "
                        f"(step busy), over {judged}; prefill steps are left out. The idle "
                        f"by cause chart below covers every step of {DRAWN}.")
            m[3].metric("CPU work / step", short_ms(s.cpu_ms),
                        help=f"cpu.schedule + prepare + launch + post, median per step of "
                        f"{DRAWN}.")
    st.plotly_chart(ab_figure(sa, sb, (tps[0], tps[1]), tput=tput), key=f"{key}.figure",
                    config={"displaylogo": False})
    longest = max(sa.duration_s, sb.duration_s) * 1000
    choices = [s for s in SPANS_MS if s <= max(longest, SPANS_MS[0])] or [SPANS_MS[0]]
    default = min(choices, key=lambda s: abs(s - min(250, longest)))
    span = st.select_slider("Timeline span shown (the last ms of each window, same scale)",
                            choices, value=default, key=f"{key}.span")
    for side, s, w in (("a", sa, a), ("b", sb, b)):  # one window shown twice: two keys
        fig = timeline_figure(w.records, window_ms=float(span), end_ns=s.end_ns,
                              height_px=300, legend=True,
                              title=f"{s.label}: the last {span} ms of the window",
                              x_title="ms before the window's end")
        st.plotly_chart(fig, key=f"{key}.timeline.{side}.{s.label}",
                        config={"displaylogo": False})
