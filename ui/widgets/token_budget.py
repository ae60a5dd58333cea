"""The Live page's token budget panel: the budget control, beside it the predicted p99 ITL
and throughput at a few budgets, and under them each budget change with the prediction taken
before it beside the measurement after it.

Owns the drawing and the tab's BudgetWatch (in the tab's session state: the prediction kept
across the change). The control is ui/widgets/controls.py's, the numbers
ui/figures/token_budget.py's, the model telemetry/prefill_tax.py's. It must never call the
engine from anywhere but the script thread, and never fit anything itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamlit as st

from ui.engine_link import current_settings, engine_errors, engine_status
from ui.figures.token_budget import (
    MIN_MEASURED_STEPS,
    BudgetWatch,
    prediction_rows,
    predictions,
    trial_rows,
    what_if_budgets,
)
from ui.widgets.controls import token_budget_input

if TYPE_CHECKING:
    from engine.process.client import EngineClient

WATCH_KEY = "budget.watch"
PANEL_PERIOD_S = 2.0  # a fit over a few hundred steps each time: light, but no need for 1 Hz
SNAPSHOT_STEPS = 4000  # the newest steps read per refresh (the measurement's reach)


def watch() -> BudgetWatch:
    """This tab's watch of the budget (made on first use)."""
    w = st.session_state.get(WATCH_KEY)
    if not isinstance(w, BudgetWatch):
        w = st.session_state[WATCH_KEY] = BudgetWatch()
    return w


def token_budget_panel(client: EngineClient) -> None:
    """The panel (a fragment every PANEL_PERIOD_S, in an expander on the Live page)."""
    if engine_status(client).state != "alive":
        return  # the banner says why
    with engine_errors(client, "Reading the engine's settings"):
        settings = current_settings(client)
    if "max_num_batched_tokens_range" not in settings:
        st.caption("This engine does not report a live token budget.")
        return
    with engine_errors(client, "Reading the engine's telemetry"):
        records = client.telemetry().snapshot_steps(SNAPSHOT_STEPS)
    draw_panel(client, settings, records)


def draw_panel(client: EngineClient, settings: dict[str, Any], records: list) -> None:
    """The control and the what-if table side by side, the changes under them."""
    budget = int(settings["max_num_batched_tokens"])
    budgets = what_if_budgets(budget, settings["max_num_batched_tokens_range"])
    w = watch()
    w.observe(budget, records, engine=settings.get("engine_pid"))
    control, table = st.columns([1, 3])
    with control:
        token_budget_input(client, settings)
        st.caption("Predictions come from a fit of step time against decode tokens, prefill "
                   "tokens and context over the last steps (the prefill tax); a step's period "
                   "is the wait between two tokens of a running request.")
    with table:
        preds, reason = predictions(records, budgets)
        with st.container(key="budget-predictions"):
            if preds:
                st.table(prediction_rows(preds, budget))
            else:
                st.caption(f"No prediction yet: {reason}")
    if w.trials:
        with st.container(key="budget-trials"):
            st.markdown("**Budget changes: predicted before, measured after**")
            st.table(trial_rows(w.trials))
            st.caption(f"Measured over the steps scheduled under the new budget, shown once "
                       f"{MIN_MEASURED_STEPS} ran; the prediction is the one taken from the "
                       "steps before the change, kept as it was.")
