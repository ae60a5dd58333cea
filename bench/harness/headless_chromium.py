"""Driving the dashboard headless: Debian's Chromium with the flags that work on this kind
of machine, a free loopback port, waiting until a Streamlit server answers, and stopping
it with all it started.

Shared by the browser test and the dashboard benchmark. Imports neither streamlit nor
playwright; it never reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps calling out of a closed network.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
# Tabs other than the focused one keep drawing (for tests that watch several tabs).
BACKGROUND_TAB_ARGS = (
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, limit_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until `url`'s Streamlit health check answers "ok"; raises if `proc` (the server, when
    it is a child process) exits first or the limit passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode} before serving")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"streamlit did not answer {url}/_stcore/health within {limit_s} s")


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server started with start_new_session=True and all it started (its engine):
    SIGCONT first, since a stopped process cannot exit, then SIGTERM, SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGCONT)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
