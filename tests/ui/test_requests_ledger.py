"""The Requests page's ledger: finished apart from aborted, slowest first, and a button that
opens the Live timeline paused on a request's steps (AppTest over the stand-in engine)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
from fake_engine import FakeEngineClient
from streamlit.testing.v1 import AppTest
from test_pages_engine import engine, page  # noqa: F401  (the real engine, one per module)
from test_pages_fake import live_figures

from telemetry.ledger import LedgerEntry, build_ledger
from telemetry.records import RequestEvent, Span, StepRecord
from ui.figures.ledger_table import (
    LIVE_FROZEN_KEY,
    LIVE_HIGHLIGHT_KEY,
    LIVE_PAUSE_KEY,
    LIVE_URL_PATH,
    LIVE_WINDOW_KEY,
    LIVE_WINDOWS_MS,
    ledger_rows,
    outcome_counts,
    window_for,
)

APP = Path(__file__).resolve().parents[2] / "app.py"
MS = 1_000_000


def plotly_array(value: object) -> list:
    """An array of a figure's JSON: a list, or plotly's typed array ({"dtype", "bdata"})."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)  # type: ignore[call-overload]


def test_the_live_pages_state_names_are_the_ones_it_uses():
    text = (APP.parent / "ui" / "pages" / "live.py").read_text()
    assert f'PAUSE_KEY = "{LIVE_PAUSE_KEY}"' in text
    assert f'FROZEN_KEY = "{LIVE_FROZEN_KEY}"' in text
    assert f'WINDOW_KEY = "{LIVE_WINDOW_KEY}"' in text
    assert f'HIGHLIGHT_KEY = "{LIVE_HIGHLIGHT_KEY}"' in text
    assert f"TIMELINE_WINDOWS_MS = {LIVE_WINDOWS_MS}" in text
    assert re.search(rf"st\.Page\({LIVE_URL_PATH},", APP.read_text())


def test_outcomes_count_aborted_apart_and_running_as_neither():
    assert outcome_counts(["stop", "length", "abort", None, "error", "abort"]) == (3, 2)


def test_window_holds_the_requests_steps():
    e = LedgerEntry("a", first_step_ns=0, last_step_ns=300 * MS)
    assert window_for(e) == 500
    assert window_for(LedgerEntry("b", first_step_ns=0, last_step_ns=9000 * MS)) == 5000
    assert window_for(LedgerEntry("c")) == 5000


def ride(fake: FakeEngineClient) -> tuple[list[StepRecord], list[RequestEvent]]:
    """Three requests on six steps of 1 ms: 'slow' rides all, 'quick' two, 'cut' is aborted."""
    t0 = fake.bus.snapshot_steps(1)[-1].spans[-1].end_ns + MS
    chunks = [[("slow", 8, 8)], [("slow", 1, 9), ("quick", 4, 4)],
              [("slow", 1, 10), ("quick", 1, 5), ("cut", 6, 6)], [("slow", 1, 11)],
              [("slow", 1, 12)], [("slow", 1, 13)]]
    steps = [StepRecord(1000 + k, "async", 0, len(c), 0, len(c), chunks=c,
                        spans=[Span("compute", t0 + k * MS, t0 + k * MS + MS // 2)])
             for k, c in enumerate(chunks)]
    ev = [RequestEvent("slow", "queued", t0 - MS, prompt_tokens=8),
          RequestEvent("quick", "queued", t0, prompt_tokens=4),
          RequestEvent("cut", "queued", t0 + MS, prompt_tokens=6),
          RequestEvent("slow", "scheduled", t0, prompt_tokens=8),
          RequestEvent("quick", "scheduled", t0 + MS, prompt_tokens=4),
          RequestEvent("cut", "scheduled", t0 + 2 * MS, prompt_tokens=6),
          RequestEvent("quick", "finished", t0 + 2 * MS + MS // 2, reason="stop",
                       cached_tokens=3),
          RequestEvent("cut", "finished", t0 + 3 * MS, reason="abort"),
          RequestEvent("slow", "finished", t0 + 6 * MS, reason="length", preemptions=1)]
    for s in steps:
        fake.bus.publish_step(s)
    for e in ev:
        fake.bus.publish_event(e)
    return steps, ev


def test_rows_say_what_each_request_cost():
    fake = FakeEngineClient()
    steps, ev = ride(fake)
    rows = {r["request"]: r for r in ledger_rows(build_ledger(steps, ev, 1024).values())}
    assert rows["quick"]["cached"] == 3 and rows["slow"]["preemptions"] == 1
    assert rows["slow"]["steps"] == "1000–1005" and rows["slow"]["decode steps"] == 5
    assert rows["quick"]["KV read MiB"] == (4 + 5) * 1024 / 2**20


def test_requests_page_shows_the_ledger_and_opens_the_timeline_on_a_request(
        fake: FakeEngineClient) -> None:
    steps, _ = ride(fake)
    at = AppTest.from_file(str(APP), default_timeout=30)
    at.run()
    at.switch_page("ui/pages/requests.py").run()
    assert not at.exception
    tiles = {m.label: m.value for m in at.metric}
    assert (tiles["finished"], tiles["aborted"]) == ("2", "1")
    ledger = at.dataframe[1].value  # after the table of recent requests
    assert list(ledger["request"]) == ["slow", "quick", "cut"]  # 7, 2.5 and 2 ms: slowest first
    assert list(ledger["status"]) == ["length", "stop", "abort"]
    assert at.selectbox(key="req.ledger_pick").value == "slow"
    at.selectbox(key="req.ledger_pick").set_value("quick").run()
    at.button(key="req.to_timeline").click().run()
    assert not at.exception
    assert at.session_state[LIVE_PAUSE_KEY] is True
    # 'quick' rode steps 1001 and 1002; the frozen window holds its neighbours too.
    frozen = [r.step for r in at.session_state[LIVE_FROZEN_KEY]]
    assert {1000, 1001, 1002, 1003, 1004, 1005} <= set(frozen)
    assert at.session_state[LIVE_HIGHLIGHT_KEY] == {"request": "quick", "steps": [1001, 1002]}
    assert at.toggle(key="live.pause").value is True  # now on the Live page, paused
    assert at.session_state[LIVE_WINDOW_KEY] == 50
    assert not at.warning
    # The timeline lights the request's own steps and fades the others.
    fig = live_figures(at)["live.timeline"]
    assert "request quick's 2 steps lit" in fig["layout"]["title"]["text"]
    (compute,) = [t for t in fig["data"] if t["name"].startswith("compute:")]
    lit = [o == 1.0 for o in plotly_array(compute["marker"]["opacity"])]
    assert sum(lit) == 2 and len(lit) > 2  # its two compute spans; the neighbours faded


def test_the_ledger_of_a_request_on_the_real_engine(engine) -> None:  # noqa: F811
    """Through the dashboard's own client (engine process, wire, telemetry mirror): a reply's
    ledger row has its steps, a device-time share and the KV it read."""
    prompt = "import os\nimport sys\n" * 4
    engine.generate(prompt, {"max_tokens": 6, "temperature": 0.0})
    out = engine.generate(prompt, {"max_tokens": 6, "temperature": 0.0})
    at = page("ui/pages/requests.py")
    assert not at.exception and not at.error
    ledger = at.dataframe[1].value
    row = ledger[ledger["request"] == out.request_id].iloc[0]
    assert row["status"] == "length" and row["output"] == 6
    assert row["cached"] == out.num_cached_tokens > 0
    assert row["prefill steps"] >= 1 and row["decode steps"] == 5
    assert row["device ms"] > 0 and row["KV read MiB"] > 0
