"""Fragments that know they are running: ``st.fragment`` with a marker their body can read.

A page's live parts are fragments that rerun every second (the banner, the Live page's
charts, controls and gauges). An engine failure met inside one of them must not draw the
dead-engine or not-responding page there: that page holds a fragment of its own with a
timer (its watch), and a timed fragment inside a timed fragment, which the next full run no
longer draws, is what Streamlit's front end handles worst (white screens: streamlit#15084,
stale content: #16708). In the browser a tab whose engine was killed was sometimes left
blank, sidebar and all, while a tab on a page without live fragments showed the message
(tests/browser, 2026-12-04). So ui/engine_trouble.py asks ``in_fragment()`` and, inside one,
reruns the whole app, whose first engine call draws that page at the top level.

Streamlit's own record of the running fragment is internal and has changed between
releases, hence the marker of our own.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import streamlit as st

_state = threading.local()  # fragment bodies run on the session's script thread


def in_fragment() -> bool:
    """Whether a body wrapped by live_fragment is running on this thread."""
    return getattr(_state, "depth", 0) > 0


def live_fragment(body: Callable[..., Any], run_every: float | None = None) -> Callable[..., Any]:
    """``st.fragment(run_every=...)(body)``, marked while the body runs."""

    @functools.wraps(body)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return body(*args, **kwargs)
        finally:  # also when the body stops or reruns (Streamlit raises through here)
            _state.depth -= 1

    return st.fragment(run_every=run_every)(marked)
