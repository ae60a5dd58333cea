"""The engine-side facts that name a stall, and the one place each step is judged.

Owns `StallWatch`: it times garbage collections (gc.callbacks, whichever thread runs them),
keeps the marks other parts of the engine leave (an engine command, a CUDA graph capture, a
sentinel check), reads the CPU time and run-queue wait of the step threads (the loop thread;
on the CPU also the thread that runs compute and its intra-op pool) from
/proc/self/task/<tid>/schedstat (Linux; elsewhere those facts are unknown), and runs
telemetry.stalls.StallDetector on every step record before the loop publishes it, so that
every reader (the dashboard, /metrics, a recording) sees the one verdict the record carries.

Marks may come from any thread (a deque append is atomic); observe() runs on the loop's
thread only. It never decides what runs, never waits, and never raises into the loop.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections import deque
from typing import Any

from telemetry.records import StepRecord
from telemetry.stalls import GC, Mark, StallDetector, StepFacts

log = logging.getLogger("gapless.stalls")
now = time.perf_counter_ns

MAX_MARKS = 512  # marks kept for the steps not judged yet; older ones are dropped
GC_MIN_NS = 100_000  # shorter collections (most young ones) leave no mark
RESCAN_STEPS = 512  # steps between looks for the compute thread's pool


class StallWatch:
    """Facts for telemetry.stalls, gathered in the engine process. close() at shutdown."""

    def __init__(self, detector: StallDetector | None = None,
                 compute_thread: int | None = None) -> None:
        """``compute_thread``: the native id of the thread that runs compute on the host
        (host-emulated streams), whose run-queue wait (and its pool's) delays a step as the
        loop's does."""
        self.detector = detector or StallDetector()
        self.marks: deque[Mark] = deque(maxlen=MAX_MARKS)
        self._gc_start = 0
        self._tid: int | None = None
        self._fd: int | None = None
        self._cpu = self._runqueue = 0
        # The compute thread and the threads it started (torch's intra-op pool, which takes
        # its name), found again every RESCAN_STEPS steps: the pool starts with the first
        # parallel work.
        self._compute = compute_thread
        self._workers: dict[int, _ThreadStat] = {}
        self._until_rescan = 0
        self._floor = 0  # marks that ended before this can overlap no step still to judge
        self._last_end = 0
        gc.callbacks.append(self._on_gc)

    # ------------------------------------------------------------------------- marks
    def add_mark(self, cause: str, start_ns: int, end_ns: int, label: str = "") -> None:
        """Something that ran over [start_ns, end_ns] and may stall a step (any thread)."""
        self.marks.append(Mark(cause, start_ns, end_ns, label))

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = now()
            return
        end = now()
        if end - self._gc_start >= GC_MIN_NS:
            self.marks.append(Mark(GC, self._gc_start, end,
                                   f"generation {info.get('generation')} GC"))

    # ----------------------------------------------------------------------- the step
    def observe(self, rec: StepRecord, next_record: StepRecord | None) -> None:
        """Judge ``rec`` (on the loop's thread, before it is published); ``next_record`` is
        the step launched after it, if any. A flagged record carries its stall fields."""
        cpu, runqueue = self._thread_times()
        marks = self.marks
        floor = self._floor
        while marks and marks[0].end_ns < floor:
            marks.popleft()
        w_cpu, w_rq = self._workers_times() if self._compute is not None else (None, None)
        facts = StepFacts(list(marks) if marks else [], cpu, runqueue, next_record, w_cpu, w_rq)
        try:
            self.detector.observe(rec, facts)
        except Exception:  # a bug here must cost the verdict, never the step
            log.exception("stall detection failed for step %d", rec.step)
        end = self.detector.last_end_ns
        self._floor, self._last_end = min(self._last_end, end), end

    def _thread_times(self) -> tuple[int | None, int | None]:
        """CPU time and run-queue wait of the calling thread since the previous call."""
        tid = threading.get_ident()
        if tid != self._tid:  # the first step of this thread: its times start now
            self._tid = tid
            self._open(threading.get_native_id())
            return None, None
        if self._fd is None:
            return None, None
        try:
            cpu_s, rq_s, _ = os.pread(self._fd, 96, 0).split()
            cpu, rq = int(cpu_s), int(rq_s)
        except (OSError, ValueError):
            self.close_fd()
            return None, None
        d_cpu, d_rq = cpu - self._cpu, rq - self._runqueue
        self._cpu, self._runqueue = cpu, rq
        return d_cpu, d_rq

    def _workers_times(self) -> tuple[int | None, int | None]:
        """CPU time and run-queue wait of the compute thread and its pool since the previous
        call."""
        if self._until_rescan <= 0:
            self._until_rescan = RESCAN_STEPS
            self._find_workers()
        self._until_rescan -= 1
        cpu = rq = 0
        known = False
        for stat in self._workers.values():
            got = stat.times()
            if got is not None:
                cpu, rq, known = cpu + got[0], rq + got[1], True
        return (cpu, rq) if known else (None, None)

    def _find_workers(self) -> None:
        try:
            with open(f"/proc/self/task/{self._compute}/comm") as f:
                name = f.read()
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return
        for tid in tids:
            if tid in self._workers:
                continue
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    if f.read() != name:
                        continue
            except OSError:  # ended meanwhile
                continue
            self._workers[tid] = _ThreadStat(tid)

    def _open(self, native_id: int) -> None:
        self.close_fd()
        try:
            self._fd = os.open(f"/proc/self/task/{native_id}/schedstat", os.O_RDONLY)
            cpu_s, rq_s, _ = os.pread(self._fd, 96, 0).split()
            self._cpu, self._runqueue = int(cpu_s), int(rq_s)
        except (OSError, ValueError):
            self.close_fd()

    def close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def close(self) -> None:
        """Stop timing collections and let the thread's stat file go (at shutdown)."""
        try:
            gc.callbacks.remove(self._on_gc)
        except ValueError:
            pass
        self.close_fd()
        for stat in self._workers.values():
            stat.close()
        self._workers = {}


class _ThreadStat:
    """Another thread's CPU time and run-queue wait, read from its schedstat file (kept
    open)."""

    def __init__(self, tid: int) -> None:
        self.cpu = self.rq = 0
        try:
            self.fd: int | None = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = None
        self.times()

    def times(self) -> tuple[int, int] | None:
        """CPU time and run-queue wait since the previous call (None: unknown)."""
        if self.fd is None:
            return None
        try:
            cpu_s, rq_s, _ = os.pread(self.fd, 96, 0).split()
            cpu, rq = int(cpu_s), int(rq_s)
        except (OSError, ValueError):
            self.close()
            return None
        delta = (cpu - self.cpu, rq - self.rq)
        self.cpu, self.rq = cpu, rq
        return delta

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
