"""The fork server's own process: a fresh interpreter that imports what every engine process
imports (torch, transformers' auto classes, the engine) once, then forks an engine process
for each request of its owner. engine/process/forkserver.py is the owner's side and says when
it is used.

Each engine it forks:
- runs in a process group of its own, as a spawned engine does;
- gets, passed over the socket (SCM_RIGHTS), its end of the owner's pipe and the write end of
  the pipe its stderr goes to, and the owner's environment and working folder of that moment;
- leaves the fork server's loop and runs engine.process.server's main as
  `python -c "from engine.process.server import main; main()"` would (its exit code, its
  traceback and its interpreter shutdown are that command's), with `--parent` this process:
  the engine exits once this process is gone, which happens as soon as the owner is gone.

This process stays single-threaded (fork copies only the calling thread: a lock held by another
thread would stay held in the child). It reaps its children and tells the owner each one's exit
code; it never touches CUDA (forkserver.py uses it only on machines without a GPU).
"""

from __future__ import annotations

import argparse
import os
import pickle
import select
import signal
import socket
import sys
from pathlib import Path

TITLE_ROOM = 160  # spare command-line characters the owner starts this process with
MAX_MESSAGE = 1 << 20  # a request: the environment, the working folder, the engine's arguments
# What this process tells its owner (each a tuple with the tag first): its imports are done
# (its pid), a request's fork is done (request id, pid), a child exited (pid, exit code as
# subprocess gives it: -N for signal N).
UP, FORKED, REAPED = "fork-server-up", "forked", "reaped"


def set_name(name: str, args: list[str]) -> None:
    """The process's name in ps -o comm, top and /proc/PID/comm, and its command line in ps
    and /proc/PID/cmdline: a forked engine starts with this process's command line, so both
    are rewritten to tell them apart. The command line is written over the memory the
    kernel shows (as setproctitle does), cut to what the original held: the fork server is
    started with TITLE_ROOM spare characters for that."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        room = end - start
        title = b"\0".join(a.encode() for a in args)[:room - 1]
        ctypes.memmove(start, title.ljust(room, b"\0"), room)
    except (OSError, AttributeError, IndexError, ValueError):  # not Linux: names stay python
        pass


def preload() -> None:
    """The imports that take most of an engine process's start: torch, transformers' auto
    classes with the generation utilities they pull in, the Llama modeling code (the default
    model's family) and the engine."""
    import torch  # noqa: F401
    import transformers
    from transformers.models.llama import modeling_llama  # noqa: F401

    _ = transformers.AutoModelForCausalLM, transformers.AutoTokenizer  # lazy modules: load them
    import engine.engine  # noqa: F401
    import engine.process.server  # noqa: F401
    import telemetry.nvml  # noqa: F401


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="gapless engine fork server (started by "
                                     "engine.process.forkserver)")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the owner")
    parser.add_argument("--title-room", default="", help="spare characters for set_name")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_name("gapless-forksrv", ["gapless-forksrv", "engine.process.forkserver_main", "--fd",
                                 str(args.fd)])
    sock = socket.socket(fileno=args.fd)
    os.set_inheritable(args.fd, False)
    preload()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child's exit wakes select (wakeup fd)
    sock.send(pickle.dumps((UP, os.getpid())))
    engine_argv = serve(sock, wake_r, wake_w)
    # Here only in a forked engine process: run it as `python -c "...server import main;
    # main()"` runs, this function's caller being that command's last line.
    from engine.process.server import main as server_main

    server_main(engine_argv)


def serve(sock: socket.socket, wake_r: int, wake_w: int) -> list[str]:
    """The fork server's loop; returns (in a forked child only) the engine's arguments."""
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
        except OSError:
            data, fds = b"", []
        if not data:  # the owner is gone: so are we (our engines follow, see the docstring)
            os._exit(0)
        request = pickle.loads(data)
        pid = os.fork()
        if pid == 0:
            return _become_engine(request, fds, sock, wake_r, wake_w)
        for fd in fds:
            os.close(fd)
        sock.send(pickle.dumps((FORKED, request["id"], pid)))


def _become_engine(request: dict, fds: list[int], sock: socket.socket, wake_r: int,
                   wake_w: int) -> list[str]:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.close(wake_r)
    os.close(wake_w)
    sock.close()  # only the fork server speaks to the owner over it
    os.setpgid(0, 0)  # a process group of its own, as a spawned engine's (spawn.py says why)
    conn_fd, err_fd = fds
    os.dup2(err_fd, 2)
    os.close(err_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = ["--fd", str(conn_fd), "--parent", str(os.getppid()), "--owner",
            str(request["owner"]), *request["args"]]
    sys.argv = ["-c", *argv]
    set_name("gapless-engine", ["gapless-engine", "engine.process.server", *argv])
    return argv


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        try:
            sock.send(pickle.dumps((REAPED, pid, os.waitstatus_to_exitcode(status))))
        except OSError:  # the owner is gone; the next recv ends this process
            return
