"""Engine processes forked from a fork server, where that is safe: the owner's side.

An engine process spawned fresh spends most of its start importing (torch, transformers'
auto classes and the generation utilities they pull in). The fork server (forkserver_main.py)
is one fresh interpreter, started by the owner the first time it needs an engine, that has
done those imports; each later engine is a fork of it. A dashboard's Restart, and every test
that starts an engine, waits that much less.

Used only where forking cannot go wrong:
- on a machine with no NVIDIA device (no /dev/nvidiactl, /dev/nvidia0, /proc/driver/nvidia):
  CUDA cannot be used in a process forked after CUDA was initialised, and nothing here has
  shown that the imports leave it uninitialised on a GPU machine;
- for an engine whose `device` is "cpu" or "auto";
- with the environment the fork server was started with, but for VOLATILE variables
  (modules read some variables when imported: TRITON_INTERPRET, HF_HUB_OFFLINE...): another
  environment gets a fork server of its own, up to MAX_SERVERS, then engines spawned fresh;
- unless GAPLESS_ENGINE_FORKSERVER=0 (the config-free switch for a user who wants every
  engine a fresh interpreter).
Anything that fails on the way (the fork server will not start, dies, is stopped, or does
not fork within REPLY_TIMEOUT_S) falls back to a fresh spawn, logged; a fork server that
failed so is not asked again (the next engine gets a new one). The price: the fork server
stays resident while its owner runs (the size of an interpreter with torch imported), its
pages shared copy-on-write with the engines it forks.

The forked engine behaves as a spawned one (spawn.EngineProcess) to its owner: the same pipe,
stderr relayed, a process group of its own, the exit code (from the fork server, which reaps
it) and reason, kill() with SIGKILL. Its parent is the fork server, which exits as soon as the
owner does (its socket to the owner closes); the engine's watchdog then sees it re-parented
and exits, and a stopped engine's orphaned process group gets SIGHUP + SIGCONT from the
kernel, as before.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine import envs
from engine.process.forkserver_main import FORKED, REAPED, TITLE_ROOM, UP
from engine.process.spawn import (
    EngineProcess,
    engine_argv,
    engine_env,
    exit_reason,
    last_words,
    relay_stderr,
)

log = logging.getLogger("gapless.process")

ENV_SWITCH = envs.GAPLESS_ENGINE_FORKSERVER
GPU_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia")
READY_TIMEOUT_S = 120.0  # the fork server's imports
REPLY_TIMEOUT_S = 5.0  # a fork: a copy of page tables, well under a second on a busy machine
MAX_SERVERS = 2
# Variables that change while a process runs and that no import reads: a fork server started
# before the change serves on (pytest sets the first for each test).
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def forkserver_wanted(device: str) -> bool:
    """Whether an engine on `device` is forked from a fork server here (see the docstring)."""
    if not envs.get(ENV_SWITCH):
        return False
    return device in ("cpu", "auto") and not any(Path(p).exists() for p in GPU_NODES)


def start_engine_process(listen: Path | None, device: str) -> Any:
    """An engine process for an owner: forked from this process's fork server where that is
    wanted and works, else spawned fresh (spawn.EngineProcess)."""
    if forkserver_wanted(device):
        env = engine_env()
        server = _server_for(env)
        if server is not None:
            try:
                return server.fork(listen, env)
            except (OSError, TimeoutError, EOFError) as e:
                server.give_up()
                log.warning("the engine fork server failed (%s): spawning a fresh engine "
                            "process", e)
    return EngineProcess(listen)


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


def _server_for(env: dict[str, str]) -> ForkServer | None:
    # The pid too: a process forked from an owner must not speak on its parent's socket.
    key = (os.getpid(), sys.executable,
           tuple(sorted((k, v) for k, v in env.items() if k not in VOLATILE)))
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.alive():
            return server
        if server is None and len(_servers) >= MAX_SERVERS:
            return None
        try:
            _servers[key] = server = ForkServer(env)
        except (OSError, TimeoutError, EOFError) as e:
            log.warning("the engine fork server did not start (%s): engines are spawned "
                        "fresh", e)
            _servers.pop(key, None)
            return None
        return server


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T stopped, Z exited but not reaped), None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class ForkServer:
    """One fork server process (forkserver_main.py) and the owner's end of its socket."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-P", "-c",
                "from engine.process.forkserver_main import main; main()",
                "--fd", str(theirs.fileno()), "--title-room", "." * TITLE_ROOM]
        try:
            # Its own process group, as an engine's: a terminal's Ctrl-C reaches the owner only.
            self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL, env=env, process_group=0)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._started: dict[int, Any] = {}  # request id -> pid, once the fork is done
        self._engines: dict[int, ForkedEngine] = {}  # pid -> engine, until its exit is told
        self._exits: dict[int, int] = {}  # exit codes told before the engine was registered
        self._cond = threading.Condition()
        self._gone = False
        self._given_up = False
        ours.settimeout(READY_TIMEOUT_S)
        try:
            kind, self.pid = pickle.loads(self._recv())
            if kind != UP:
                raise EOFError(f"the engine fork server said {kind!r} first")
        except BaseException:
            self.proc.kill()
            ours.close()
            raise
        ours.settimeout(None)
        threading.Thread(target=self._read, daemon=True,
                         name=f"gapless-forkserver-{self.pid}").start()

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 16)
        if not data:
            raise EOFError("the engine fork server closed its socket")
        return data

    def alive(self) -> bool:
        return not self._gone and not self._given_up and self.proc.poll() is None

    def give_up(self) -> None:
        """Ask this fork server for nothing more (it failed a fork): the next engine gets a
        new one. It is left running: the engines it forked are its children."""
        self._given_up = True

    def stopped(self) -> bool:
        """Stopped (SIGSTOP, a debugger): it cannot fork until continued."""
        return _state(self.pid) in ("T", "t")

    def fork(self, listen: Path | None, env: dict[str, str]) -> ForkedEngine:
        """A new engine process, forked; its pipe's other end and its stderr's write end are
        passed to the fork server, which closes its copies once the child has them.
        OSError when the fork server is stopped, TimeoutError when it does not answer within
        REPLY_TIMEOUT_S."""
        if self.stopped():
            raise OSError(f"the engine fork server (pid {self.pid}) is stopped")
        parent_sock, child_sock = socket.socketpair()
        err_r, err_w = os.pipe()
        request_id = next(self._ids)
        request = dict(id=request_id, env=env, cwd=os.getcwd(), owner=os.getpid(),
                       args=engine_argv(listen))
        try:
            with self._send_lock:
                socket.send_fds(self.sock, [pickle.dumps(request)], [child_sock.fileno(), err_w])
            with self._cond:
                if not self._cond.wait_for(lambda: request_id in self._started or self._gone,
                                           REPLY_TIMEOUT_S):
                    raise TimeoutError(f"no fork within {REPLY_TIMEOUT_S:g} s")
                if request_id not in self._started:
                    raise EOFError("the engine fork server exited")
                pid = self._started.pop(request_id)
                engine = ForkedEngine(pid, parent_sock, os.fdopen(err_r, "rb"))
                self._engines[pid] = engine
                if pid in self._exits:  # it died before we got here
                    engine.ended(self._exits.pop(pid))
        except BaseException:
            parent_sock.close()
            os.close(err_r)
            raise
        finally:
            child_sock.close()
            os.close(err_w)
        return engine

    def _read(self) -> None:
        """Messages from the fork server: forks done, children's exit codes."""
        try:
            while True:
                message = pickle.loads(self._recv())
                with self._cond:
                    if message[0] == FORKED:
                        self._started[message[1]] = message[2]
                        self._cond.notify_all()
                    elif message[0] == REAPED:
                        engine = self._engines.pop(message[1], None)
                        if engine is None:
                            self._exits[message[1]] = message[2]
                        else:
                            engine.ended(message[2])
        except (OSError, EOFError):
            pass
        with self._cond:  # it died (killed?): its engines' exit codes are lost with it
            self._gone = True
            self._cond.notify_all()
            orphans = list(self._engines.values())
            self._engines.clear()
        log.warning("the engine fork server (pid %s) is gone", self.pid)
        for engine in orphans:
            threading.Thread(target=engine.await_end_unreaped, daemon=True).start()


class ForkedEngine:
    """An engine process forked by a ForkServer, as spawn.EngineProcess shows one: pid, conn
    (the owner's end of its pipe), last_output, exited, exit_reason(), running(), kill(),
    wait()."""

    def __init__(self, pid: int, sock: socket.socket, stderr: Any) -> None:
        self.pid = pid
        self.conn = Connection(sock.detach())
        self.last_output: deque[str] = deque(maxlen=200)
        self.exited = threading.Event()
        self.returncode: int | None = None
        threading.Thread(target=relay_stderr, args=(stderr, self.last_output), daemon=True,
                         name=f"gapless-client-stderr-{pid}").start()

    def ended(self, code: int) -> None:
        self.returncode = code
        self.exited.set()

    def await_end_unreaped(self) -> None:
        """Its fork server died first: it is init's child now, so its exit code is lost;
        notice its end (the pid gone once init reaps it)."""
        while not self.exited.wait(0.2):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.exited.set()
            except PermissionError:  # the pid was reused by another user's process
                self.exited.set()

    def exit_reason(self) -> str:
        code = self.returncode
        if code:  # a crash prints on its way out: give the relay a moment to catch it
            threading.Event().wait(0.1)
        if code is None and self.exited.is_set():
            return "engine process exited (its exit code was lost with its fork server)"
        return exit_reason(code, last_words(list(self.last_output)))

    def running(self) -> bool:
        return not self.exited.is_set()

    def kill(self) -> None:
        """SIGKILL: ends a hung or stopped process too."""
        if not self.exited.is_set():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> bool:
        """True when the process has exited within ``timeout``: reaped by its fork server, or
        a zombie its fork server has not reaped yet (a stopped fork server reaps nothing)."""
        deadline = time.monotonic() + timeout
        while not self.exited.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if _state(self.pid) in (None, "Z"):
                return True
            if time.monotonic() >= deadline:
                return False
        return True
