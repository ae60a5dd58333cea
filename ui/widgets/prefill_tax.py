"""The prefill tax on the Live page (the engine's recent steps) and on the Recordings page.

Owns where the section sits and how often it refreshes: a collapsible section under the Live
page's controls, redrawn every REFRESH_S from the last WINDOW_STEPS steps the engine
published, and the same section for one window of a recording. What it draws comes from
ui/figures/prefill_tax.py; the arithmetic from telemetry/prefill_tax.py. It must never draw
from a thread other than the script's, and never reach the engine except through the client
it is handed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import streamlit as st

from telemetry.prefill_tax import WINDOW_STEPS, prefill_tax
from telemetry.records import StepRecord
from ui.engine_link import engine_errors, engine_status
from ui.figures.prefill_tax import fit_caption, headline, prefill_tax_figure
from ui.widgets.fragments import live_fragment
from ui.widgets.live_plot import live_plot

if TYPE_CHECKING:
    from engine.process.client import EngineClient

REFRESH_S = 2.0  # a fit of a few hundred steps is cheap; the page's charts come first
HEIGHT_PX = 330
TITLE = "Prefill tax: what a prefill chunk costs the running decodes"
ABOUT = ("Each step's period (from the previous step's end to its own: what a running "
         "request waits between two tokens) is fitted by least squares against its decode "
         "tokens, its prefill tokens and the context its tokens read, over the last "
         "{n} steps. The fit splits each step between its decodes and its prefill chunk; "
         "the ITL bars compare decode-only steps with steps that also carried a chunk; the "
         "device time is the compute lane's, split by the same fit. docs/prefill-tax.md says "
         "what the model leaves out.")


def draw_prefill_tax(records: Sequence[StepRecord], *, key: str,
                     window_steps: int = WINDOW_STEPS, live: bool = False) -> None:
    """The headline, the three panels and the fit's terms for the last ``window_steps`` of
    ``records``."""
    tax = prefill_tax(records, window_steps=window_steps)
    st.markdown(headline(tax))
    fig = prefill_tax_figure(tax, records, height_px=HEIGHT_PX)
    if live:
        fig.update_layout(uirevision=key)
        live_plot(fig, key=key, height_px=HEIGHT_PX)
    else:
        st.plotly_chart(fig, key=key, config={"displaylogo": False})
    st.caption(fit_caption(tax))


def _live_body(client: EngineClient) -> None:
    if engine_status(client).state != "alive":
        return  # the banner says why
    with st.expander(TITLE, icon=":material/functions:"):
        st.caption(ABOUT.format(n=WINDOW_STEPS))
        with engine_errors(client, "Reading the engine's telemetry"):
            records = client.telemetry().snapshot_steps(WINDOW_STEPS + 1)
            draw_prefill_tax(records, key="live.prefill_tax", live=True)


def prefill_tax_live(client: EngineClient) -> None:
    """The Live page's section: the engine's last WINDOW_STEPS steps, every REFRESH_S."""
    live_fragment(_live_body, REFRESH_S)(client)


def prefill_tax_recording(windows: Mapping[str, Sequence[StepRecord]], *, key: str) -> None:
    """The Recordings page's section: one of the recording's windows (its modes), all steps
    of it fitted at once."""
    labels = list(windows)
    if not labels:
        return
    st.subheader(TITLE)
    label = labels[0]
    if len(labels) > 1:
        label = st.selectbox("Window", labels, key=f"{key}.window")
    steps = list(windows[label])
    st.caption(ABOUT.format(n=f"{len(steps)} (the whole window)"))
    try:
        draw_prefill_tax(steps, key=key, window_steps=max(len(steps), 1))
    except (TypeError, ValueError) as exc:  # a hand-made file's chunks: said, not raised
        st.warning(f"The prefill tax cannot read this recording's step chunks "
                   f"(request id, tokens, context after): {exc}")
