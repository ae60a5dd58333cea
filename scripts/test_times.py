"""Seconds per test folder from pytest's junit XML: where the suite's time goes.

    .venv/bin/python -m pytest -q --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_times.py /tmp/suite.xml [/tmp/other.xml ...]

Each test case's time in the XML is its setup, call and teardown together, so a module- or
session-scoped fixture is charged to the first test that uses it. Per folder the script sums
them (tests/engine, tests/serving, ...; a test file directly under tests/ counts as "tests/");
the suite's wall time is the XML's own figure. Under pytest-xdist the test cases of several
workers overlap, so the folders add up to more than the wall time: the folder column then
says where the workers spent their time, the wall line how long one waited.
With several files (one run per folder, say) the rows and the walls are summed.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def folder_of(case: ET.Element) -> str:
    """tests/<folder> of a test case, from its file attribute or its dotted classname."""
    path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
    parts = Path(path).parts
    if len(parts) >= 3 and parts[0] == "tests":
        return f"tests/{parts[1]}"
    return "tests/"


def outcome(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def read(paths: list[Path]) -> tuple[dict[str, dict[str, float]], float]:
    """folder -> {'seconds', 'passed', 'skipped', 'failure', 'error'}, and summed wall time."""
    rows: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall = 0.0
    for path in paths:
        root = ET.parse(path).getroot()
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        for suite in suites:
            wall += float(suite.get("time", 0.0))
            for case in suite.iter("testcase"):
                row = rows[folder_of(case)]
                row["seconds"] += float(case.get("time", 0.0))
                row[outcome(case)] += 1
    return rows, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+", type=Path, help="junit XML file(s) written by pytest")
    args = ap.parse_args()
    rows, wall = read(args.xml)
    total = sum(r["seconds"] for r in rows.values())
    print("| folder | seconds | share | passed | skipped | failed |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["seconds"]):
        share = r["seconds"] / total if total else 0.0
        print(f"| {name} | {r['seconds']:.1f} | {share:.0%} | {r['passed']:.0f} | "
              f"{r['skipped']:.0f} | {r['failure'] + r['error']:.0f} |")
    print(f"| all folders | {total:.1f} | 100% | "
          f"{sum(r['passed'] for r in rows.values()):.0f} | "
          f"{sum(r['skipped'] for r in rows.values()):.0f} | "
          f"{sum(r['failure'] + r['error'] for r in rows.values()):.0f} |")
    print(f"\nwall time (the XML's own): {wall:.1f} s")


if __name__ == "__main__":
    main()
