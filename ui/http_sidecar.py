"""The HTTP API beside the dashboard's own engine (config.yaml's ``http_port``).

Owns starting `python -m engine serve --attach SOCKET` as a child process once the
dashboard's engine listens on a socket, and stopping it with the engine. The API runs in its
own process: neither the dashboard's nor the engine's (docs/design.md section 5), and the
dashboard never imports the tokenizer (transformers would bring torch). The attached serve
outlives an engine's death: it re-attaches on its own once the dashboard has restarted the
engine, and it exits when the dashboard's process is gone (--exit-with-parent).
``revive_http_api`` starts it again should it have exited anyway. Never imports streamlit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def http_api_command(socket_path: str | Path, config_path: str, port: int,
                     host: str = "127.0.0.1") -> list[str]:
    """The command line of the API process (run from the repository's folder)."""
    return [sys.executable, "-m", "engine", "serve", "--attach", str(socket_path), "--config",
            str(config_path), "--host", host, "--port", str(port), "--log-level", "warning",
            "--exit-with-parent"]


def start_http_api(socket_path: str | Path, config_path: str, port: int,
                   host: str = "127.0.0.1") -> subprocess.Popen[bytes]:
    """`python -m engine serve --attach socket_path` on host:port; its output goes to ours."""
    return subprocess.Popen(http_api_command(socket_path, config_path, port, host), cwd=REPO,
                            stdin=subprocess.DEVNULL)


def revive_http_api(proc: subprocess.Popen[bytes] | None) -> subprocess.Popen[bytes] | None:
    """The API process, started again with the same command if it has exited (call it after
    restarting the engine); None stays None (no API configured)."""
    if proc is None or proc.poll() is None:
        return proc
    return subprocess.Popen(proc.args, cwd=REPO, stdin=subprocess.DEVNULL)


def stop_http_api(proc: subprocess.Popen[bytes] | None, timeout_s: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
