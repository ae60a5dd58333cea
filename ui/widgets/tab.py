"""Which browser tab a script run belongs to, for the logs: "tab " and the first eight
characters of Streamlit's session id, so a restart, a kill or a settings change in the
server log says who asked. It must never fail: outside a script run it answers "a tab"."""

from __future__ import annotations


def tab_id() -> str:
    try:
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx()
    except Exception:  # another Streamlit layout, or no runtime (tests)
        ctx = None
    session = getattr(ctx, "session_id", None)
    return f"tab {session[:8]}" if session else "a tab"
