"""Counts the checks in tests/ that can fail: `assert` statements, `pytest.raises`,
`pytest.warns` and `pytest.fail` calls, and test functions, per file, from the source (AST).

A change that makes the suite faster must not lower these numbers; compare two commits:

    python scripts/count_checks.py                 # the working tree
    python scripts/count_checks.py --rev HEAD~1    # a commit (read with git show)
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAISING = {"raises", "warns", "fail"}


def count(source: str) -> tuple[int, int]:
    """(checks, test functions) in one file's source."""
    checks = tests = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            checks += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in RAISING and isinstance(node.func.value, ast.Name)
              and node.func.value.id == "pytest"):
            checks += 1
        elif (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
              and node.name.startswith("test")):
            tests += 1
    return checks, tests


def sources(rev: str | None) -> dict[str, str]:
    if rev is None:
        return {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "tests").rglob("*.py")}
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "tests"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{rev}:{n}"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
            for n in names if n.endswith(".py")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="a git commit (default: the working tree)")
    ap.add_argument("--files", action="store_true", help="one line per file")
    args = ap.parse_args()
    total_checks = total_tests = 0
    for name, text in sorted(sources(args.rev).items()):
        checks, tests = count(text)
        total_checks += checks
        total_tests += tests
        if args.files and (checks or tests):
            print(f"{checks:5d} {tests:4d}  {name}")
    print(f"{total_checks:5d} {total_tests:4d}  total (checks, test functions)")


if __name__ == "__main__":
    main()
