"""The length of a union of intervals has one owner, telemetry.metrics.union_length: every
kernel-busy figure (the kernel lane's samples, the Step anatomy, the waterfall, the bench
traces) sums it, so overlapping kernels count once everywhere. A second definition anywhere
in the product fails here; its own samples show the scan can fail."""

from __future__ import annotations

import ast
from pathlib import Path

from telemetry.metrics import union_length

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("engine", "telemetry", "ui", "bench", "scripts")
OWNER = "telemetry/metrics.py"


def test_overlaps_count_once_and_touching_intervals_join():
    assert union_length([(0, 10), (5, 15), (20, 25)]) == 20
    assert union_length([(20, 25), (0, 10), (10, 12)]) == 17  # unsorted, touching
    assert union_length([(0, 100), (10, 20), (30, 40)]) == 100  # nested
    assert union_length([]) == 0
    assert isinstance(union_length([(0, 3), (1, 5)]), int)  # ns in, ns out
    assert union_length([(0.5, 1.5), (1.0, 2.0)]) == 1.5  # us in, us out


def second_definitions(path: Path, text: str) -> list[str]:
    """Functions other than the owner's that compute a union's length: named for a union, or
    summing sorted intervals while carrying the furthest end reached."""
    found = []
    lines = text.splitlines()
    maybe = "sorted(" in text and "reach" in text
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        src = "\n".join(lines[node.lineno - 1:node.end_lineno]) if maybe else ""
        sweeps = "sorted(" in src and "reach" in src and "total +=" in src
        if "union" in node.name.lower() or sweeps:
            found.append(f"{path}:{node.lineno}: {node.name}")
    return found


def test_the_scan_finds_a_copy_by_name_or_by_shape():
    by_name = "def union_us(iv):\n    return 0\n"
    by_shape = ("def covered(iv):\n    total, reach = 0, None\n"
                "    for a, b in sorted(iv):\n        total += b - a\n    return total\n")
    assert second_definitions(Path("x.py"), by_name) == ["x.py:1: union_us"]
    assert second_definitions(Path("x.py"), by_shape) == ["x.py:1: covered"]
    assert second_definitions(Path("x.py"), "def spans(iv):\n    return sorted(iv)\n") == []


def test_the_product_computes_a_union_length_once():
    found = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != OWNER and not rel.startswith("bench/results/"):
                found += second_definitions(Path(rel), path.read_text(encoding="utf-8"))
    assert not found, f"a second interval-union length beside {OWNER}: {found}"
