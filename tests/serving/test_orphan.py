"""An engine stopped with SIGSTOP whose owner (serve) is then killed does not stay stopped: it
runs in its own process group, which the kernel sends SIGHUP and SIGCONT when the group is
orphaned, so it exits although its own watchdog thread could not run.

Negative control: with ``process_group=0`` removed from engine/process/spawn.py's Popen, this
test fails with the engine still stopped (state T) 30 s after its owner was killed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from serve_process import start_server


def _state(pid: int) -> str | None:
    """The process's state letter (T stopped, Z zombie...), None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_stopped_orphan_engine_exits(tmp_path):
    srv = start_server(tmp_path, "--on-engine-death", "stay")
    pid = srv.engine_pid()
    try:
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while _state(pid) != "T":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        srv.proc.kill()  # the owner dies without a word
        srv.proc.wait(30)
        deadline = time.monotonic() + 30
        while _state(pid) not in (None, "Z"):  # a zombie has exited (init reaps it)
            assert time.monotonic() < deadline, f"engine {pid} state {_state(pid)}"
            time.sleep(0.1)
    finally:
        if _state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)
        srv.stop()
