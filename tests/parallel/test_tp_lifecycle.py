"""No orphans: the worker ranks end when rank 0's process is killed (SIGKILL: no shutdown,
no atexit), because a worker reads EOF on its pipe to rank 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, time
from engine import Engine, EngineConfig
eng = Engine(EngineConfig(model=sys.argv[1], device="cpu", tensor_parallel_size=2,
                          max_num_seqs=2, max_num_batched_tokens=16, num_blocks=16,
                          max_model_len=32), start=True)
print("PIDS", *eng.tp.worker_pids, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Exited (a zombie waiting to be reaped by whoever adopted it counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_workers_exit_when_rank0_is_killed(tiny_model_dir):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tiny_model_dir("llama"))],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = ""
        deadline = time.monotonic() + 240
        while not line.startswith("PIDS") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line.startswith("PIDS"), f"the engine did not start (exit {proc.poll()})"
        pids = [int(p) for p in line.split()[1:]]
        assert pids and not any(gone(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 20
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(gone(p) for p in pids), "a worker rank outlived its killed engine"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
