"""Finding the engine process an owner (a serve or streamlit process, this test) started.

An owner's engine process is its child running engine.process.server, or, where the owner
forks its engines from a fork server (engine/process/forkserver.py: machines without a GPU),
a child of that fork server, its own child. A forked engine's command line is its fork
server's, so the fork server is told apart by being the owner's child.
"""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first, then the parent's pid)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def parent_of(pid: int) -> int:
    return int(_stat(pid)[1])


def process_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet."""
    try:
        return _stat(pid)[0] == "Z"
    except FileNotFoundError:
        return True


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid``. A thread that ends while they are read (a
    Streamlit server starts and ends a thread per script run) is skipped, not taken for the
    whole process gone: that read as "no engine" now and then."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # the process is gone
        return []
    out: list[int] = []
    for t in tasks:
        try:
            out += [int(p) for p in (t / "children").read_text().split()]
        except OSError:  # this thread ended meanwhile
            continue
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return b""


def engine_pids(owner_pid: int) -> list[int]:
    """The engine processes `owner_pid` runs now, spawned or forked."""
    found = []
    for child in _children(owner_pid):
        cmd = _cmdline(child)
        if b"engine.process.forkserver_main" in cmd:
            found += _children(child)
        elif b"engine.process.server" in cmd:
            found.append(child)
    return found
