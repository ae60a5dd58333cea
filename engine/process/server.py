"""The engine process: an Engine, an NVML sampler and a load generator behind its clients.

Owns the child side of the process boundary (docs/design.md section 5). spawn.py starts this
module as a fresh interpreter (``python -c "from engine.process.server import main; main()"
--fd N --parent PID [--listen PATH]``; forkserver.py forks it with ``--owner PID`` too),
hands it one end of a socket pair (the owner's pipe)
and sends the EngineConfig as a dict (Command.START). The child builds the Engine, answers
Ready (or Failed with a message a user can act on, e.g. a missing model) and then serves
commands until the owner shuts it down or is gone. With --listen it also accepts attached
clients on a Unix socket (endpoint.py); each client gets its own requests' deltas, every
client gets the telemetry and the heartbeat. The wire format is wire.py's.

Threads: the step loop (the Engine's own), one reader per client running its commands, one
sender per client (links.py), the pump (pump.py: telemetry, NVML, heartbeat), the acceptor,
and a watchdog. The step loop's only client work is putting a message into a queue.

The child never imports streamlit or anything under ui/ (multiprocessing's spawn would
re-run the parent's __main__ here, which under `streamlit run` is streamlit's launcher:
that is why the client starts a plain interpreter instead). It ignores SIGINT (Ctrl-C in a
terminal reaches the whole process group; the owner decides when the engine stops) and
exits when its owner dies: the pipe reaches EOF and a watchdog thread sees getppid()
change. PR_SET_PDEATHSIG is deliberately not used: it fires when the *thread* that started
the child exits, and a Streamlit script thread that created the client ends at every rerun.
"""

from __future__ import annotations

import argparse
import enum
import faulthandler
import logging
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engine.process import endpoint
from engine.process.commands import Commands
from engine.process.links import ClientLink
from engine.process.pump import Pump
from engine.process.wire import NO_REPLY, Closing, Command, Failed, Ready, Reply, describe, encode

log = logging.getLogger("gapless.server")

WATCHDOG_PERIOD_S = 0.5
ACCEPT_POLL_S = 0.5


class After(enum.Enum):
    """What a client's reader does after a call."""

    GO_ON = enum.auto()
    STOP = enum.auto()  # the owner shut the engine down
    LEAVE = enum.auto()  # an attached client detached


class EngineServer:
    """Serves the owner's pipe and any attached clients. Commands of one client run in the
    order sent, on that client's reader thread; commands that change the engine's state
    (configure, load generator, benchmark) are serialised across clients by ``commands.lock``."""

    def __init__(self, engine: Any, nvml: Any, listener: socket.socket | None = None,
                 listen_path: Path | None = None, owner_pid: int | None = None) -> None:
        self.engine = engine
        self.commands = Commands(engine, self.process_info)
        self.owner_pid = os.getppid() if owner_pid is None else owner_pid
        self.nvml = nvml
        self.listener = listener
        self.listen_path = listen_path
        self.links: list[ClientLink] = []
        self.links_lock = threading.Lock()
        self.stopping = threading.Event()
        self.pump = Pump(engine, nvml, self.connected, self.stopping)
        self._names = iter(range(1, 1 << 62))

    # ------------------------------------------------------------------------ clients
    def add_link(self, conn: Connection, owner: bool) -> ClientLink:
        link = ClientLink(conn, "owner" if owner else f"client-{next(self._names)}", owner)
        link.put(Ready({
            "pid": os.getpid(),
            "settings": self.engine.settings(),
            "nvml_available": self.nvml.available,
            "nvml_reason": None if self.nvml.available else self.nvml.reason,
            "owner": owner,
            "listen": None if self.listen_path is None else str(self.listen_path),
        }))
        with self.links_lock:
            self.links.append(link)
        return link.start()

    def serve(self, owner: ClientLink) -> int:
        """Runs the owner's commands on this thread until it shuts the engine down (0) or
        its pipe closes (3): the exit code of the process."""
        self.pump.start()
        if self.listener is not None:
            threading.Thread(target=self._accept_loop, name="gapless-accept", daemon=True).start()
        while True:
            try:
                call = owner.conn.recv()
            except (EOFError, OSError):
                self.abandon(f"the engine's owner (pid {self.owner_pid}) closed its pipe "
                             "without a shutdown")
                return 3
            except Exception:
                log.exception("unreadable frame from the owner")
                continue
            if self.handle(owner, call) is After.STOP:
                return 0

    def _accept_loop(self) -> None:
        assert self.listener is not None
        self.listener.settimeout(ACCEPT_POLL_S)
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed at shutdown
            if endpoint.peer_uid(sock) != os.getuid():
                log.warning("refused a client of another user on %s", self.listen_path)
                sock.close()
                continue
            sock.setblocking(True)
            link = self.add_link(Connection(sock.detach()), owner=False)
            log.info("%s attached", link.name)
            threading.Thread(target=self._serve_attached, args=(link,), daemon=True,
                             name=f"gapless-recv-{link.name}").start()

    def _serve_attached(self, link: ClientLink) -> None:
        while not link.gone.is_set():
            try:
                call = link.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:
                if link.conn.closed:
                    break
                log.exception("unreadable frame from %s", link.name)
                continue
            if self.handle(link, call) is not After.GO_ON:
                break
        self.detach(link)

    def detach(self, link: ClientLink) -> None:
        """An attached client leaves: what it submitted and nobody can see any more ends."""
        with self.links_lock:
            if link not in self.links:
                return
            self.links.remove(link)
        open_ids = list(link.open)
        for rid in open_ids:
            self.engine.abort(rid)
        link.close(2.0)
        log.info("%s detached (%d open requests aborted)", link.name, len(open_ids))

    def connected(self) -> list[ClientLink]:
        with self.links_lock:
            return list(self.links)

    def attached(self) -> list[ClientLink]:
        with self.links_lock:
            return [link for link in self.links if not link.owner]

    # ----------------------------------------------------------------------- commands
    def handle(self, link: ClientLink, call: Any) -> After:
        """Run one call; say what the client's reader does next."""
        try:
            call_id, command, payload = call
        except (TypeError, ValueError):
            log.error("%s sent a frame that is not a Call: %r", link.name, type(call))
            return After.GO_ON
        try:
            command = Command(command)
        except ValueError:
            self.answer(link, call_id, False, ("ValueError", f"unknown engine command "
                        f"{command!r}; known: {', '.join(c.value for c in Command)}"))
            return After.GO_ON
        try:
            kwargs = pickle.loads(payload)
        except Exception as e:  # e.g. a class this process cannot import
            self.answer(link, call_id, False, ("ValueError", f"the engine process cannot read "
                        f"the arguments of {command}: {describe(e)}"))
            return After.GO_ON
        if command is Command.SHUTDOWN and link.owner:
            self.shutdown()
            self.answer(link, call_id, True, None)
            link.close(10.0)
            return After.STOP
        if command in (Command.SHUTDOWN, Command.DETACH):
            self.answer(link, call_id, not link.owner, None if not link.owner else (
                "ValueError", "the owner cannot detach; shut the engine down instead"))
            return After.GO_ON if link.owner else After.LEAVE
        if command is Command.RUN_BENCHMARK:
            self.commands.start_benchmark(link, call_id, **kwargs)
            return After.GO_ON
        if command is Command.RECORD_ANATOMY:  # waits for N steps: off the reader thread,
            threading.Thread(  # so the client's other commands go on meanwhile
                target=self.run_command, args=(link, call_id, command, kwargs), daemon=True,
                name=f"gapless-anatomy-{link.name}").start()
            return After.GO_ON
        self.run_command(link, call_id, command, kwargs)
        return After.GO_ON

    def run_command(self, link: ClientLink, call_id: int, command: Command,
                    kwargs: dict[str, Any]) -> None:
        """Run one command and answer the client with its value or its error."""
        fn = self.commands.table.get(command)
        try:
            if fn is None:
                raise ValueError(f"{command} is not a command a running engine takes")
            value = fn(link, **kwargs)
        except Exception as e:
            if not isinstance(e, ValueError):
                log.exception("engine command %s failed", command)
            self.answer(link, call_id, False, (type(e).__name__, describe(e)))
        else:
            self.answer(link, call_id, True, value)

    def answer(self, link: ClientLink, call_id: int, ok: bool, value: Any) -> None:
        if call_id == NO_REPLY:  # a notification: nobody waits; failures only get logged
            if not ok:
                log.warning("%s: a notification failed: %s", link.name, value[1])
            return
        link.put(Reply(call_id, ok, value))

    def process_info(self, link: ClientLink) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "parent_pid": os.getppid(),
            "python": sys.executable,
            "streamlit_imported": "streamlit" in sys.modules,
            "ui_imported": any(m == "ui" or m.startswith("ui.") for m in sys.modules),
            "nvml_available": self.nvml.available,
            "nvml_reason": self.nvml.reason,
            "listen": None if self.listen_path is None else str(self.listen_path),
            "clients": len(self.links),
            "owner": link.owner,
        }

    # ---------------------------------------------------------------------- stopping
    def shutdown(self) -> None:
        """The owner ends the engine: requests end "abort", attached clients are told."""
        self.stopping.set()
        self._close_listener()
        self.commands.stop_drivers()
        self.engine.shutdown()
        self.nvml.close()
        for link in self.attached():
            link.put(Closing("the engine was shut down by its owner"))
            link.close(2.0)

    def abandon(self, reason: str) -> None:
        """The owner is gone: tell the attached clients why (the caller then exits at once)."""
        log.warning("%s: exiting", reason)
        self.stopping.set()
        self._close_listener()
        for link in self.attached():
            link.put(Closing(f"{reason}; the engine process exited"))
            link.close(0.5)

    def _close_listener(self) -> None:
        if self.listener is not None:
            self.listener.close()
            if self.listen_path is not None:
                try:
                    self.listen_path.unlink()
                except OSError:
                    pass


def _watch_parent(parent_pid: int, owner_pid: int, on_gone: Callable[[str], None]) -> None:
    """Exit at once when the parent is gone (we were re-parented): nothing here outlives it.
    The kernel frees the device memory of a process that exits. The parent is the owner,
    or the owner's fork server (forkserver.py), which exits when the owner does."""
    while True:
        if os.getppid() != parent_pid:
            on_gone(f"the engine's owner (pid {owner_pid}) is gone")
            os._exit(4)
        time.sleep(WATCHDOG_PERIOD_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="gapless engine process (started by "
                                     "engine.process.client.EngineClient)")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the owner")
    parser.add_argument("--parent", type=int, required=True,
                        help="pid of the parent process: the owner, or its fork server")
    parser.add_argument("--owner", type=int, default=None,
                        help="pid of the owner process, when the parent is its fork server")
    parser.add_argument("--listen", help="also accept clients on this Unix socket path")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()  # a crash in native code (CUDA, triton) says where, on stderr
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="engine[%(process)d] %(levelname)s %(name)s: %(message)s")
    os.set_inheritable(args.fd, False)  # nothing we start may hold the owner's pipe open
    conn = Connection(args.fd)
    server: list[EngineServer] = []

    def gone(reason: str) -> None:
        if server:
            server[0].abandon(reason)
        log.warning("%s: exiting", reason)

    owner = args.parent if args.owner is None else args.owner
    threading.Thread(target=_watch_parent, args=(args.parent, owner, gone), name="gapless-watchdog",
                     daemon=True).start()
    try:
        _, _, payload = conn.recv()
        config_dict = pickle.loads(payload)["config"]
    except (EOFError, OSError):
        os._exit(3)
    listener: socket.socket | None = None
    listen_path: Path | None = None
    try:
        if args.listen:  # first: a path that cannot be used fails before the model loads
            listener, listen_path = endpoint.bind(args.listen)
        from engine.config import EngineConfig
        from engine.engine import Engine
        from telemetry.nvml import NvmlSampler

        config = EngineConfig.from_dict(config_dict)
        engine = Engine(config)
        nvml = NvmlSampler(interval_s=config.nvml_interval_s)
        nvml.start()
    except BaseException as e:
        traceback.print_exc()
        if listen_path is not None:
            listen_path.unlink(missing_ok=True)
        try:
            conn.send([encode(Failed(describe(e)))])
        finally:
            conn.close()
        sys.exit(1)
    server.append(EngineServer(engine, nvml, listener, listen_path, owner_pid=owner))
    code = server[0].serve(server[0].add_link(conn, owner=True))
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: torch's can take seconds, nothing is left


if __name__ == "__main__":
    main()
