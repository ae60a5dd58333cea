"""CPU-seconds per test, folder and module: a pytest plugin, and the table it feeds.

Wall seconds under pytest-xdist overlap and stretch with the load; on a 2-core machine the
full line is bound by CPU, so what a change saves is best read in CPU-seconds. The plugin
writes, for each test (setup, call and teardown), its wall seconds and the CPU-seconds of the
worker itself and of the child processes it reaped meanwhile (engine processes, servers,
interpreter children: os.times()'s children fields, which count a child once it is waited
for; a module's engine is charged to the test whose teardown stops it). CPU of a process
nobody waits for (an orphan init reaps) is not seen; `/usr/bin/time` around the run gives the
whole. Run phase 1 with it, then print the table:

    CPU_PER_TEST_DIR=/tmp/cpu PYTHONPATH=scripts OMP_NUM_THREADS=1 .venv/bin/python -m pytest \\
        -q -n 3 --dist loadgroup --no-loadscope-reorder -m "not browser" -p cpu_per_test
    .venv/bin/python scripts/cpu_per_test.py /tmp/cpu [N modules]
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import time

import pytest

_out = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201
    global _out
    if _out is None:
        folder = os.environ.get("CPU_PER_TEST_DIR", "artifacts/cpu")
        os.makedirs(folder, exist_ok=True)
        name = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl"
        _out = open(os.path.join(folder, name), "a")  # noqa: SIM115 (open for the session)
    t0, w0 = os.times(), time.monotonic()
    yield
    t1, w1 = os.times(), time.monotonic()
    _out.write(json.dumps({
        "id": item.nodeid, "wall": w1 - w0,
        "self": t1.user - t0.user + t1.system - t0.system,
        "children": (t1.children_user - t0.children_user
                     + t1.children_system - t0.children_system)}) + "\n")
    _out.flush()


def table(folder: str, top: int = 30) -> str:
    rows = [json.loads(line) for f in glob.glob(os.path.join(folder, "*.jsonl"))
            for line in open(f)]
    by_module: dict = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    by_folder: dict = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for r in rows:
        module = r["id"].split("::")[0]
        parts = module.split("/")
        group = "/".join(parts[:2]) if len(parts) > 2 else "tests/ (top-level files)"
        for acc in (by_module[module], by_folder[group]):
            acc[0] += r["wall"]
            acc[1] += r["self"]
            acc[2] += r["children"]
            acc[3] += 1
    out = ["| folder or module | wall s | worker CPU-s | children CPU-s | CPU-s | tests |",
           "|---|---:|---:|---:|---:|---:|"]

    def line(name: str, v: list) -> str:
        return f"| {name} | {v[0]:.0f} | {v[1]:.0f} | {v[2]:.0f} | {v[1] + v[2]:.0f} | {v[3]} |"

    key = lambda kv: -(kv[1][1] + kv[1][2])  # noqa: E731
    out += [line(k, v) for k, v in sorted(by_folder.items(), key=key)]
    total = [sum(v[i] for v in by_folder.values()) for i in range(4)]
    out.append(line("**all**", total))
    out.append("| | | | | | |")
    out += [line(k, v) for k, v in sorted(by_module.items(), key=key)[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    print(table(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
