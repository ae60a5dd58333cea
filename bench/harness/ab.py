"""`python -m bench ab`: one suite, the same benchmark code, against two source trees.

    git archive BEFORE | tar -x -C /tmp/before; git archive AFTER | tar -x -C /tmp/after
    python -m bench ab step-cpu --trees /tmp/before,/tmp/after --rounds 3 -- --batch 16 64

Each round runs the suite once per tree, in alternated order (A B, then B A, ...), so drift and
other load on the machine hit both. Each run is this checkout's bench/ (linked into a scratch
folder that comes first on the path) over the tree's engine/ and telemetry/ (PYTHONPATH), so only
the code under test differs. The table gives, for every number in the suites' summaries, the
median over rounds before and after and the verdict on after against before: each round is an
alternated pair, judged by telemetry.verdict (the dashboard's rule: a 95% interval over the
pairs, in the same words). Owns processes and the table; measures nothing itself.
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
from dataclasses import dataclass
from pathlib import Path

from bench.harness import report
from telemetry.verdict import Interval, Verdict, runs_verdict


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


@dataclass(slots=True, frozen=True)
class Row:
    """One figure of the suite: medians over the rounds, and after against before."""

    key: str
    before: float
    after: float
    change: Interval | None  # after over before in %, over the rounds as alternated pairs
    verdict: Verdict


def compare(before: list[dict], after: list[dict]) -> list[Row]:
    """A Row for every number both sides report in every round; ``before[i]`` and
    ``after[i]`` are the summaries of round i."""
    b = [flatten(s) for s in before]
    a = [flatten(s) for s in after]
    keys = [k for k in b[0] if all(k in x for x in b + a)] if b and a else []
    rows = []
    for k in keys:
        xb, xa = [x[k] for x in b], [x[k] for x in a]
        positive = all(v > 0 for v in xb + xa)
        v = runs_verdict(xb, xa, what=k, a_label="before", b_label="after",
                         higher_is_better=None) if positive else Verdict(False, None, "", "–")
        rows.append(Row(k, statistics.median(xb), statistics.median(xa), v.change, v))
    return rows


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
        got: dict[str, dict] = {}
        for label, tree in (order if r % 2 == 0 else order[::-1]):
            summary = run_in_tree(tree, args.suite, common, out / label / f"round{r + 1}")
            if summary is not None:
                got[label] = summary
        if len(got) == 2:  # a round is a pair only when both sides ran
            for label, summary in got.items():
                sides[label].append(summary)
    rows = [(row.key, f"{row.before:.4g}", f"{row.after:.4g}",
             f"{row.after / row.before:.3f}" if row.before else "",
             f"{row.change.lo:+.1f}% to {row.change.hi:+.1f}%" if row.change else "",
             row.verdict.kind) for row in compare(sides["before"], sides["after"])]
    title = (f"A/B of `{args.suite}`: {trees[0]} (before) vs {trees[1]} (after), medians of "
             f"{len(sides['before'])} rounds; each round an alternated pair (telemetry.verdict)")
    report.emit(out, "ab", title, [title, report.markdown_table(
        ["figure", "before", "after", "after / before", "95% interval", "verdict"], rows)],
        {"trees": [str(t) for t in trees], "rows": rows, "summaries": sides})
    return 0 if sides["before"] and sides["after"] else 1
