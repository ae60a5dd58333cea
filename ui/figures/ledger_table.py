"""The Requests page's ledger table and its link to the timeline: pure functions, no Streamlit.

Owns how telemetry.ledger's entries read on the page (one row per finished request, slowest
first, in units a person reads: s, ms, MiB) and which state opens the Live page paused on a
request's steps. The Live page (app.py) owns those state keys and the window choices; the
names are repeated here once, and tests/ui/test_requests_ledger.py checks they still match.

It must never read the bus or the engine itself (the page hands over what it read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from telemetry.ledger import LedgerEntry, steps_of
from telemetry.records import StepRecord

# The Live page's (ui/pages/live.py): its pause toggle, its frozen snapshot, its window slider
# and choices, and the steps it highlights.
LIVE_PAUSE_KEY = "live.pause"
LIVE_FROZEN_KEY = "live.frozen"
LIVE_WINDOW_KEY = "live.window_ms"
LIVE_HIGHLIGHT_KEY = "live.highlight"
LIVE_WINDOWS_MS = (50, 100, 250, 500, 1000, 2000, 5000)
LIVE_URL_PATH = "live_page"  # the Live page is the callable live_page: its url path


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _span(steps: list[int]) -> str:
    if not steps:
        return ""
    return f"{steps[0]}" if steps[0] == steps[-1] else f"{steps[0]}–{steps[-1]}"


def ledger_rows(entries: Iterable[LedgerEntry]) -> list[dict[str, Any]]:
    """One row per entry, in the order given (slowest_first's)."""
    rows = []
    for e in entries:
        steps = e.steps
        rows.append({
            "request": e.request_id,
            "status": e.finish_reason or "running",
            "e2e ms": _ms(e.e2e_s),
            "queue ms": _ms(e.queue_s),
            "TTFT ms": _ms(e.ttft_s),
            "prompt": e.prompt_tokens,
            "cached": e.cached_tokens,
            "output": e.output_tokens,
            "prefill steps": len(e.prefill_steps),
            "decode steps": len(e.decode_steps),
            "steps": _span(steps),
            "device ms": e.device_ns / 1e6,
            "KV read MiB": e.kv_bytes_read / 2**20,
            "preemptions": e.preemptions,
            "partial": e.partial,
        })
    return rows


def outcome_counts(reasons: Iterable[str | None]) -> tuple[int, int]:
    """(finished, aborted) of the requests' finish reasons: an aborted request did not
    finish; a request still running (None) is neither."""
    finished = aborted = 0
    for r in reasons:
        if r == "abort":
            aborted += 1
        elif r is not None:
            finished += 1
    return finished, aborted


CONTEXT = 1.5  # the window holds the request's steps and half as much again around them


def window_for(entry: LedgerEntry, choices: Sequence[int] = LIVE_WINDOWS_MS,
               context: float = 1.0) -> int:
    """The smallest timeline window (ms) that holds the request's steps (times ``context``:
    room for its neighbours), else the largest."""
    if entry.first_step_ns is None or entry.last_step_ns is None:
        return choices[-1]
    need_ms = context * (entry.last_step_ns - entry.first_step_ns) / 1e6
    return next((w for w in choices if w >= need_ms), choices[-1])


def steps_around(entry: LedgerEntry, records: Sequence[StepRecord],
                 window_ms: float) -> list[StepRecord]:
    """The steps of a ``window_ms`` window centred on the request's steps (publish order
    kept): its own, and the others' before and after it, which the timeline fades."""
    lo, hi = entry.first_step_ns, entry.last_step_ns
    if lo is None or hi is None:
        return steps_of(entry, records)
    pad = max(0, int(window_ms * 1e6) - (hi - lo)) // 2
    return [r for r in records if r.spans and min(s.start_ns for s in r.spans) <= hi + pad
            and r.end_ns >= lo - pad]


def timeline_state(entry: LedgerEntry, records: Sequence[StepRecord]) -> dict[str, Any]:
    """The session state that opens the Live page paused on the steps around ``entry``,
    with the request's own steps highlighted among them."""
    window = window_for(entry, context=CONTEXT)
    return {LIVE_PAUSE_KEY: True, LIVE_FROZEN_KEY: steps_around(entry, records, window),
            LIVE_WINDOW_KEY: window,
            LIVE_HIGHLIGHT_KEY: {"request": entry.request_id, "steps": list(entry.steps)}}
