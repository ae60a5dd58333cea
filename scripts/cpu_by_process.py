"""Run a command and say how many CPU-seconds each kind of process in its tree used: Chromium,
the engine process, `engine serve`, Streamlit, pytest, Playwright's driver, the rest.

`/usr/bin/time` counts only the children a parent waited for, and misses Chromium's and the
engine's (no waiting parent reaps them); this samples /proc every 2 s instead (user + sys of
each process whose parent chain leads to the command), so a process that lives less than
2 s is missed and the last 2 s of each are lost. Linux only; reads nothing but /proc.

    python scripts/cpu_by_process.py -- .venv/bin/python -m pytest -q -m browser

Prints one JSON line on stderr after the command ends and exits with its status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
KINDS = (  # (kind, a substring of its command line), first match wins
    ("chromium", "chrom"),
    ("engine", "engine.process.server"),
    ("serve", "engine serve"),
    ("streamlit", "streamlit"),
    ("pytest", "pytest"),
    ("playwright-driver", "playwright"),
)


def kind_of(cmdline: str) -> str:
    return next((kind for kind, part in KINDS if part in cmdline), "other")


def processes() -> dict[str, tuple[str, float, str, str]]:
    """pid -> (parent pid, CPU-seconds so far, command line, start time), for every process
    now (the start time tells a reused pid apart)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        found[pid] = (fields[1], (int(fields[11]) + int(fields[12])) / HZ, cmd, fields[19])
    return found


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    proc = subprocess.Popen(args)
    tree = {str(proc.pid)}
    cpu: dict[tuple[str, str], tuple[str, float]] = {}  # (pid, start) -> (kind, most seen)
    while True:
        now = processes()
        grew = True
        while grew:  # the tree: the command and every descendant seen so far
            grew = False
            for pid, (ppid, *_) in now.items():
                if pid not in tree and ppid in tree:
                    tree.add(pid)
                    grew = True
        for pid in tree & now.keys():
            _, seconds, cmd, start = now[pid]
            key = (pid, start)
            cpu[key] = (kind_of(cmd), max(seconds, cpu.get(key, ("", 0.0))[1]))
        if proc.poll() is not None:
            break
        time.sleep(2)
    totals: dict[str, float] = {}
    for kind, seconds in cpu.values():
        totals[kind] = totals.get(kind, 0.0) + seconds
    report = {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    report["all"] = round(sum(totals.values()), 1)
    print(json.dumps({"cpu_seconds": report}), file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
