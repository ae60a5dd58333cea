"""`python -m bench gpu`: several suites in one device call, into one results folder.

Each suite runs as its own process (`python -m bench SUITE --out <folder>/<suite>`) with its own
time budget; one that fails or runs out of time is recorded and the next one still runs. Its
output is shown live and kept in <suite>/log.txt; the call ends with gpu.md and gpu.json in the
folder: every part, its status, its time and its command.

    python -m bench gpu --suites anatomy,async-vs-sync --budget anatomy=150,async-vs-sync=300 \\
        --args anatomy='--batches 32,1' -- --preset llama-8b

Options after `--` go to every suite whose parser knows them (a suite without --preset simply
does not get it); --args SUITE='...' go to that suite only. Owns processes and budgets; never
measures anything itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench import suites
from bench.harness import report


def parse_pairs(text: str, what: str) -> dict[str, str]:
    """'a=1,b=2' -> {'a': '1', 'b': '2'}."""
    pairs = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        if "=" not in item:
            raise SystemExit(f"python -m bench gpu: {what} wants SUITE=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        pairs[key.strip()] = value.strip()
    return pairs


def common_for(suite: str, tokens: list[str]) -> list[str]:
    """The options of `tokens` (after `--`) that the suite's parser knows, with their values."""
    known = suites.parser(suite)._option_string_actions
    kept: list[str] = []
    i = 0
    while i < len(tokens):
        opt = tokens[i].split("=", 1)[0]
        action = known.get(opt)
        takes = 0 if "=" in tokens[i] or (action is not None and action.nargs == 0) else 1
        if action is not None:
            kept += tokens[i:i + 1 + takes]
        i += 1 + takes
    return kept


def suite_command(suite: str, argv: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "bench", suite, "--out", str(out), *argv]


def run_part(suite: str, cmd: list[str], out: Path, budget: float) -> dict:
    """Run one part (`cmd`) in its own process group, its output shown and kept in
    <out>/log.txt; kill the group when its budget is spent."""
    out.mkdir(parents=True, exist_ok=True)
    print(f"\n[bench gpu] {suite}: budget {budget:.0f} s: {shlex.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=report.ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                sys.stdout.write(f"[{suite}] {line}")
                sys.stdout.flush()
                log.write(line)
                log.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=budget)
            status = "ok" if rc == 0 else f"failed (exit {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc, status = proc.returncode, f"timeout after {budget:.0f} s"
        reader.join(timeout=5)
    seconds = time.perf_counter() - t0
    print(f"[bench gpu] {suite}: {status} in {seconds:.0f} s", flush=True)
    return {"suite": suite, "status": status, "returncode": rc, "seconds": seconds,
            "command": shlex.join(["python", *cmd[1:]]), "out": str(out)}


def main(argv: list[str]) -> int:
    common: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, common = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--suites", required=True, help="comma-separated suite names, run in order")
    ap.add_argument("--budget", default="", help="SUITE=SECONDS,... (time limit of each part)")
    ap.add_argument("--default-budget", type=float, default=600.0,
                    help="seconds for a suite without --budget (default %(default)s)")
    ap.add_argument("--args", action="append", default=[], metavar="SUITE='OPTIONS'",
                    help="options for one suite only (repeatable)")
    ap.add_argument("--out", default=None, help=report.out_help())
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.suites.split(",") if s.strip()]
    for name in names:
        try:
            suites.load(name)
        except ValueError as exc:
            raise SystemExit(f"python -m bench gpu: {exc}") from None
    budgets = {k: float(v) for k, v in parse_pairs(args.budget, "--budget").items()}
    own: dict[str, list[str]] = {}
    for item in args.args:
        key, _, value = item.partition("=")
        own.setdefault(key.strip(), []).extend(shlex.split(value))
    unknown = (set(budgets) | set(own)) - set(names)
    if unknown:
        raise SystemExit(f"python -m bench gpu: --budget/--args name suites not in --suites: "
                         f"{', '.join(sorted(unknown))}")
    folder = Path(args.out) if args.out else report.run_folder()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"[bench gpu] {len(names)} suites -> {folder}", flush=True)
    parts = [run_part(n, suite_command(n, common_for(n, common) + own.get(n, []), folder / n),
                      folder / n, budgets.get(n, args.default_budget)) for n in names]
    rows = [(p["suite"], p["status"], f"{p['seconds']:.0f}", f"`{p['command']}`")
            for p in parts]
    report.emit(folder, "gpu", "Benchmark call",
                [report.markdown_table(["suite", "status", "seconds", "command"], rows,
                                       "llrl")], parts)
    return 0 if all(p["status"] == "ok" for p in parts) else 1
