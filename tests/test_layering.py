"""engine/ and telemetry/ never import UI code; telemetry/ imports nothing of ours."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UI = ("streamlit", "plotly", "ui", "pages", "app")


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", ["engine", "telemetry"])
def test_no_ui_imports(package):
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_roots(path) & set(UI)
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_telemetry_depends_on_nothing_of_ours():
    for path in sorted((ROOT / "telemetry").rglob("*.py")):
        ours = imported_roots(path) & {"engine", "ui", "pages", "bench", "training"}
        assert not ours, f"{path.relative_to(ROOT)} imports {sorted(ours)}"
