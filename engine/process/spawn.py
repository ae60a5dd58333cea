"""Starting the engine process and telling, once it has exited, why.

Owns the child process as the owner sees it: a fresh interpreter started through
subprocess with one end of a socket pair (the pipe), its stderr relayed to ours (the last
lines explain a crash), the wait for its exit, and the reason a user reads
("engine process exited with code -9 (SIGKILL)"). It never speaks the wire protocol
(session.py does) and never leaves a process behind: kill() is SIGKILL, which also ends a
stopped (SIGSTOP) or hung process, and the child runs in its own process group, which the
kernel sends SIGHUP + SIGCONT once the owner is gone (a stopped orphan does not stay stopped).

The engine starts through subprocess rather than multiprocessing's spawn context (spawn
semantics: nothing is inherited but one socket), because spawn re-runs the parent's __main__
in the child, and under `streamlit run` that imports streamlit in the engine process.
On a machine without a GPU, forkserver.py forks engines from a fork server instead (started
the same way, once); it reuses this module's stderr relay, arguments and environment.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import BinaryIO

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_OUTPUT_CHARS = 300

# "Fatal Python error: ...", or the last line of a traceback ("RuntimeError: ...").
_ERROR_LINE = re.compile(r"(Fatal Python error|[\w.]*(Error|Exception|Interrupt))\b")


def last_words(lines: list[str]) -> str | None:
    """The line of a dying process's output that says most: its latest error line (for
    a crash, faulthandler's "Fatal Python error: ..." comes before the stacks)."""
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line
    return lines[-1] if lines else None


def exit_reason(code: int | None, last_output: str | None = None) -> str:
    """What a user reads when the engine process is gone. The process's last line of
    output is added when it says something (a Python error, "Fatal Python error: ..."),
    not after SIGKILL or SIGTERM, where it is just whatever was logged last."""
    if code is None:
        return "the engine process closed its connection but did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        reason = f"engine process exited with code {code} ({name})"
        if -code in (signal.SIGKILL, signal.SIGTERM):
            return reason
    else:
        reason = f"engine process exited with code {code}"
    if code != 0 and last_output:
        reason += f"; its last output: {last_output[:MAX_OUTPUT_CHARS]}"
    return reason


def relay_stderr(stream: BinaryIO, last_output: deque[str]) -> None:
    """The engine's log goes on to our stderr; its last lines explain a crash. Returns (and
    closes the stream) once the engine process and every holder of the pipe's write end
    are gone."""
    out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
    for raw in stream:
        try:
            if out is not None:
                out.write(raw)
                out.flush()
            else:
                sys.stderr.write(raw.decode(errors="replace"))
        except (OSError, ValueError):  # our stderr is closed: keep draining the pipe
            pass
        line = raw.decode(errors="replace").strip()
        if line:
            last_output.append(line.rsplit("\r", 1)[-1])
    stream.close()


def engine_argv(listen: Path | None) -> list[str]:
    """The engine process's own arguments, beside the pipe and the parent's pid."""
    return ["--listen", str(listen)] if listen is not None else []


def engine_env() -> dict[str, str]:
    """The engine process's environment: ours, with this repository first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class EngineProcess:
    """The child interpreter running engine.process.server, and the owner's end of its pipe."""

    def __init__(self, listen: Path | None = None) -> None:
        parent_sock, child_sock = socket.socketpair()
        env = engine_env()
        fd = child_sock.fileno()
        # -P: never put the working directory first on sys.path, so `engine` is this
        # repository's package whatever folder the parent runs in.
        argv = [sys.executable, "-P", "-c", "from engine.process.server import main; main()",
                "--fd", str(fd), "--parent", str(os.getpid()), *engine_argv(listen)]
        try:
            # Its own process group: when the owner dies, the kernel sees an orphaned group
            # and sends it SIGHUP then SIGCONT, so even an engine stopped with SIGSTOP (whose
            # watchdog thread cannot run) ends instead of staying stopped forever. (Unless a
            # subreaper of the same session adopts it; then the watchdog acts once it runs.)
            # A terminal's Ctrl-C / Ctrl-Z reach the owner only; the engine ignores SIGINT.
            self.proc = subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, env=env, process_group=0)
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()  # only the child holds its end: its exit gives us EOF
        self.pid = self.proc.pid
        self.conn = Connection(parent_sock.detach())
        self.last_output: deque[str] = deque(maxlen=200)  # a crash dumps every stack
        self.exited = threading.Event()
        threading.Thread(target=self._relay_stderr, daemon=True,
                         name=f"gapless-client-stderr-{self.pid}").start()
        threading.Thread(target=self._wait, daemon=True,
                         name=f"gapless-client-wait-{self.pid}").start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited.set()

    def _relay_stderr(self) -> None:
        assert self.proc.stderr is not None
        relay_stderr(self.proc.stderr, self.last_output)

    def exit_reason(self) -> str:
        code = self.proc.returncode
        if code:  # a crash prints on its way out: give the relay a moment to catch it
            self.exited.wait(0.1)
            threading.Event().wait(0.1)
        return exit_reason(code, last_words(list(self.last_output)))

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: ends a hung or stopped process too."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> bool:
        """True when the process has exited within ``timeout``."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
