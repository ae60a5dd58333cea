"""`python -m bench ab`: one suite, the same benchmark code, against two source trees.

    git archive BEFORE | tar -x -C /tmp/before; git archive AFTER | tar -x -C /tmp/after
    python -m bench ab step-cpu --trees /tmp/before,/tmp/after --rounds 3 -- --batch 16 64

Each round runs the suite once per tree, in alternated order (A B, then B A, ...), so drift and
other load on the machine hit both. Each run is this checkout's bench/ (linked into a scratch
folder that comes first on the path) over the tree's engine/ and telemetry/ (PYTHONPATH), so only
the code under test differs. The table gives, for every number in the suites' summaries, the
median over rounds before and after. Owns processes and the comparison; measures nothing itself.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import report


def flatten(data: object, prefix: str = "") -> dict[str, float]:
    """Every number in a nested dict/list, keyed by its path ('cells.tiny b16 ids.cpu_us')."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}[{i}]"))
    elif isinstance(data, bool):
        pass
    elif isinstance(data, (int, float)):
        out[prefix] = float(data)
    return out


def compare(before: list[dict], after: list[dict]) -> list[tuple[str, float, float]]:
    """(key, median before, median after) for every number both sides report."""
    b = [flatten(s) for s in before]
    a = [flatten(s) for s in after]
    keys = [k for k in b[0] if all(k in x for x in b + a)] if b and a else []
    return [(k, statistics.median(x[k] for x in b), statistics.median(x[k] for x in a))
            for k in keys]


def run_in_tree(tree: Path, suite: str, argv: list[str], out: Path) -> dict | None:
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as scratch:
        (Path(scratch) / "bench").symlink_to(report.ROOT / "bench")
        env = {**os.environ, "PYTHONPATH": str(tree), "BENCH_COMMIT": tree.name}
        cmd = [sys.executable, "-m", "bench", suite, "--out", str(out), *argv]
        print(f"[bench ab] {tree}: {shlex.join(cmd[1:])}", flush=True)
        rc = subprocess.run(cmd, cwd=scratch, env=env).returncode
    path = out / "summary.json"
    if rc != 0 or not path.exists():
        print(f"[bench ab] {tree}: exit {rc}, no summary", flush=True)
        return None
    return json.loads(path.read_text())["summary"]


def main(argv: list[str]) -> int:
    common: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, common = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="python -m bench ab", description=__doc__.split("\n")[0])
    ap.add_argument("suite")
    ap.add_argument("--trees", required=True, help="BEFORE,AFTER: two source trees")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help=report.out_help("ab-<suite>/"))
    args = ap.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    if len(trees) != 2 or not all(t.is_dir() for t in trees):
        raise SystemExit(f"--trees wants two existing folders, got {args.trees!r}")
    out = Path(args.out) if args.out else report.run_folder() / f"ab-{args.suite}"
    sides: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = [("before", trees[0]), ("after", trees[1])]
        for label, tree in (order if r % 2 == 0 else order[::-1]):
            summary = run_in_tree(tree, args.suite, common, out / label / f"round{r + 1}")
            if summary is not None:
                sides[label].append(summary)
    rows = [(k, f"{b:.4g}", f"{a:.4g}", f"{a / b:.3f}" if b else "")
            for k, b, a in compare(sides["before"], sides["after"])]
    title = (f"A/B of `{args.suite}`: {trees[0]} (before) vs {trees[1]} (after), medians of "
             f"{len(sides['before'])} and {len(sides['after'])} rounds")
    report.emit(out, "ab", title, [title, report.markdown_table(
        ["figure", "before", "after", "after / before"], rows)],
        {"trees": [str(t) for t in trees], "rows": rows, "summaries": sides})
    return 0 if sides["before"] and sides["after"] else 1
