"""Keeping threads of an engine off their CPU for a while, for the stall tests.

The threads are pinned to one CPU beside busy processes pinned there too; where this process
may undo it (CAP_SYS_NICE), they also run under SCHED_IDLE meanwhile, so that they get next to
no CPU however loaded the machine already is. Everything is put back afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

HOGS = 3


def can_undo_sched_idle() -> bool:
    """Whether a thread of this process can leave SCHED_IDLE again (a probe on a thread of
    its own: unprivileged, a thread stays idle once made so)."""
    ok: list[bool] = []

    def probe() -> None:
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            ok.append(True)
        except OSError:
            ok.append(False)

    t = threading.Thread(target=probe)
    t.start()
    t.join()
    return ok[0]


def keep_off_cpu(tids: list[int], seconds: float) -> tuple[int, int]:
    """Keep the threads ``tids`` off their CPU for ``seconds``; returns the (start, end) of
    that stretch in perf_counter_ns."""
    cpu = min(os.sched_getaffinity(0))
    idle = can_undo_sched_idle()
    saved = {tid: os.sched_getaffinity(tid) for tid in tids}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
            for _ in range(HOGS)]
    try:
        time.sleep(0.3)  # the busy processes are running
        t0 = time.perf_counter_ns()
        for tid in tids:
            os.sched_setaffinity(tid, {cpu})
            if idle:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        time.sleep(seconds)
    finally:
        for tid, cpus in saved.items():
            try:
                if idle:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:  # the thread ended meanwhile
                pass
        t1 = time.perf_counter_ns()
        for p in hogs:
            p.kill()
            p.wait()
    return t0, t1
