"""How a page's live parts run and how a page stops early: fragments that know they are
running, and a stop that ends the run normally.

A page's live parts are fragments that rerun on a timer (the banner, the Live page's charts,
controls and gauges, the Benchmark page's controls and progress, the Requests page's tables).
Every one of them is a ``live_fragment``, so its body can ask ``in_fragment()``.

An engine failure met inside a fragment must not draw the dead-engine or not-responding
page there: that page holds a timed fragment of its own (its watch), and a timed fragment
inside a timed fragment, which the next full run no longer draws, is what Streamlit's front
end handles worst (white screens: streamlit#15084). So ui/engine_link.py reruns the
whole app from inside a fragment, and the first engine call of that run draws the page at
the top level.

A page that draws an engine's trouble stops there with ``stop_page()``, never ``st.stop()``.
Streamlit forgets the fragments a run no longer draws only when the run ends normally; after
``st.stop()`` it keeps them, and a timer rerun of one (sent by the browser before it learnt
of the new run) then writes into places the stopped page no longer has. The browser's
answer is "Bad delta path index" and a blank tab that never reconnects. ``stop_page()``
raises ``PageStopped``, which ``run_page`` catches around a page's body and app.py's main
around the banner (the run then ends normally), and ``live_fragment`` inside a fragment
(only the fragment ends).

Streamlit's own record of the running fragment is internal and has changed between
releases, hence the marker of our own. It must never call st.* outside the script thread.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import streamlit as st

_state = threading.local()  # fragment bodies run on the session's script thread


class PageStopped(Exception):  # noqa: N818 (a control-flow signal, as st.stop's own)
    """The page (or, inside a live fragment, the fragment) ends here; see stop_page()."""


def stop_page() -> NoReturn:
    """End the page's run here as a normal end (caught by app.py's main), or, inside a live
    fragment, end the fragment."""
    raise PageStopped


def run_page(body: Callable[[], object]) -> bool:
    """Run a page's body; a stop_page() in it ends the page's run normally. Whether the
    body ran to its end."""
    try:
        body()
    except PageStopped:
        return False
    return True


def in_fragment() -> bool:
    """Whether a body wrapped by live_fragment is running on this thread."""
    return getattr(_state, "depth", 0) > 0


def live_fragment(body: Callable[..., Any], run_every: float | None = None) -> Callable[..., Any]:
    """``st.fragment(run_every=...)(body)``, marked while the body runs; a stop_page()
    inside it ends the fragment only."""

    @functools.wraps(body)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            return body(*args, **kwargs)
        except PageStopped:
            return None
        finally:  # also when the body reruns the app (Streamlit raises through here)
            _state.depth -= 1

    return st.fragment(run_every=run_every)(marked)
