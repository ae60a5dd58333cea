"""The layers of DESIGN.md, enforced: engine/ and telemetry/ never import UI code;
telemetry/ imports nothing of ours; engine/core/ never imports torch (not even transitively);
the dashboard (ui/, pages/, app.py) reaches the engine only through the client, the config
and the drivers' value types, and importing those pulls no torch into its process."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UI = ("streamlit", "plotly", "ui", "pages", "app")
# What the dashboard may import of the engine (the process boundary and value types).
DASHBOARD_DOORS = {
    "engine.process.client",
    "engine.config",
    "engine.drivers.loadgen",
    "engine.drivers.workload",
    "engine.core.request",
}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module an import statement in the file names, at any depth (function
    bodies and TYPE_CHECKING blocks included)."""
    mods = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
    return mods


def imported_roots(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path)}


def py_files(*parts: str) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        p = ROOT / part
        out.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return out


@pytest.mark.parametrize("package", ["engine", "telemetry"])
def test_no_ui_imports(package):
    for path in py_files(package):
        bad = imported_roots(path) & set(UI)
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_telemetry_depends_on_nothing_of_ours():
    for path in py_files("telemetry"):
        ours = imported_roots(path) & {"engine", "ui", "pages", "bench", "training"}
        assert not ours, f"{path.relative_to(ROOT)} imports {sorted(ours)}"


def test_core_never_imports_torch_directly():
    for path in py_files("engine/core"):
        assert "torch" not in imported_roots(path), f"{path.relative_to(ROOT)} imports torch"


def test_the_dashboard_reaches_the_engine_only_through_its_doors():
    for path in py_files("ui", "pages", "app.py"):
        engine_mods = {m for m in imported_modules(path) if m.split(".")[0] == "engine"}
        bad = engine_mods - DASHBOARD_DOORS
        assert not bad, (
            f"{path.relative_to(ROOT)} imports {sorted(bad)}; the dashboard may import only "
            f"{sorted(DASHBOARD_DOORS)}"
        )


def test_core_and_the_dashboard_doors_import_no_torch_transitively():
    code = (
        "import importlib, pkgutil, sys\n"
        "import engine.core\n"
        "for m in pkgutil.iter_modules(engine.core.__path__):\n"
        "    importlib.import_module('engine.core.' + m.name)\n"
        f"for m in {sorted(DASHBOARD_DOORS)!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
