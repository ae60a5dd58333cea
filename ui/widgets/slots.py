"""The slots section of the Recordings page: the figure of ui/figures/slots.py, a line saying
what "read alone" means for each reason seen, and the per-slot numbers.

Owns drawing them only. It must never read the engine: the caller hands over the records.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from telemetry.records import StepRecord
from ui.figures.slots import (
    FALLBACK_MEANING,
    fallback_counts,
    slot_rows,
    slot_summaries,
    slots_figure,
)

SLOTS_HEIGHT_PX = 260


def slots_view(records: Sequence[StepRecord], *, key: str, table: bool = False) -> None:
    """The slots figure of `records`; `table`: the per-slot numbers under it."""
    fig = slots_figure(records, height_px=SLOTS_HEIGHT_PX, uirevision=key)
    st.plotly_chart(fig, key=key, config={"displaylogo": False})
    counts = fallback_counts(records)
    if counts:
        st.caption("Read alone: async mode read the step with nothing launched behind it, so "
                   "the device idled until the next launch. " + "; ".join(
                       f"**{reason}**: {FALLBACK_MEANING[reason]}" for reason in counts) + ".")
    if table and records:
        st.dataframe(slot_rows(slot_summaries(records)), hide_index=True, key=f"{key}.table",
                     placeholder="–")
