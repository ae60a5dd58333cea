"""Rank 0's worker processes: start them, talk to them, end them, leave no orphan.

Owns the N-1 worker processes (torch.multiprocessing 'spawn', daemonic) and one duplex pipe
to each. Waiting for a worker always has a deadline and notices a worker that died or said
why it failed, so a failed start is a clear error, not a hang. A worker ends on Stop, and by
itself when rank 0 is gone (its pipe reads EOF); `close()` stops, joins and, past a
deadline, terminates the processes it started, and only those.
"""

from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection
from typing import Any

import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.parallel.messages import Failed, RankSpans, Stop

log = logging.getLogger("gapless.parallel")


LOAD = "load the model"
# A worker is a fresh interpreter that imports the parent's main module first (spawn).
SPAWN_HINT = ("; its error is printed above. A script that starts a tensor-parallel engine must "
              "guard its entry point with `if __name__ == '__main__':` (multiprocessing spawn "
              "imports the script again in each worker)")


class WorkerError(RuntimeError):
    """A worker rank failed, died, or did not answer in time."""


class WorkerPool:
    def __init__(self, config: EngineConfig, world: int, port: int, timeout_s: float) -> None:
        from engine.parallel.follower import run_worker

        ctx = mp.get_context("spawn")
        self.timeout_s = timeout_s
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.failure: str | None = None
        for rank in range(1, world):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=run_worker, args=(rank, world, port, config, theirs),
                               name=f"gapless-tp-rank{rank}", daemon=True)
            proc.start()
            theirs.close()  # the child holds its end: EOF here once it is gone
            self.conns.append(mine)
            self.procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send_all(self, msg: object) -> None:
        self.check()
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(msg)
            except (BrokenPipeError, ConnectionResetError, OSError) as e:
                self._fail(f"rank {rank} is gone ({type(e).__name__})")

    def wait_all(self, kind: type, what: str) -> None:
        """One `kind` message from every worker, within the timeout."""
        deadline = time.monotonic() + self.timeout_s
        for rank, conn in enumerate(self.conns, start=1):
            while True:
                msg = self._recv(rank, conn, deadline, what)
                if isinstance(msg, kind):
                    break

    def _recv(self, rank: int, conn: Connection, deadline: float, what: str) -> object:
        proc = self.procs[rank - 1]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(f"rank {rank} did not {what} within {self.timeout_s:g} s")
            try:
                if conn.poll(min(left, 0.2)):
                    msg = conn.recv()
                    if isinstance(msg, Failed):
                        self._fail(f"rank {msg.rank} failed: {msg.reason}")
                    return msg
            except (EOFError, OSError):
                pass
            if not proc.is_alive():
                self._fail(f"rank {rank} exited (code {proc.exitcode}) before it could {what}"
                           f"{SPAWN_HINT if what == LOAD else ''}")

    def take_spans(self) -> list[RankSpans]:
        """What the workers sent since the last call (never blocks)."""
        out: list[RankSpans] = []
        for rank, conn in enumerate(self.conns, start=1):
            try:
                while conn.poll():
                    msg = conn.recv()
                    if isinstance(msg, RankSpans):
                        out.append(msg)
                    elif isinstance(msg, Failed):
                        self.failure = self.failure or f"rank {msg.rank} failed: {msg.reason}"
            except (EOFError, OSError):
                self.failure = self.failure or f"rank {rank} is gone"
        return out

    def check(self) -> None:
        """Raise WorkerError when a worker failed or died (a cheap non-blocking check)."""
        if self.failure is None:
            for rank, proc in enumerate(self.procs, start=1):
                if proc.exitcode is not None:
                    self.failure = f"rank {rank} exited (code {proc.exitcode})"
                    break
        if self.failure is not None:
            raise WorkerError(f"tensor-parallel worker failed: {self.failure}")

    def _fail(self, reason: str) -> None:
        self.failure = self.failure or reason
        raise WorkerError(f"tensor-parallel worker failed: {reason}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop every worker; terminate (then kill) one that does not exit in time."""
        for conn in self.conns:
            try:
                conn.send(Stop())
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("tensor-parallel worker %s did not stop; terminating", proc.name)
                proc.terminate()
                proc.join(2.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(2.0)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []
