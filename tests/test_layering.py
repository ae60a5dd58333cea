"""The layers of docs/design.md, enforced: engine/ and telemetry/ never import UI code;
telemetry/ imports nothing of ours; engine/core/ never imports torch (not even transitively);
the dashboard (ui/, app.py) reaches the engine only through the client, the shared
restart policy, the config, the env registry and the drivers' value types, and importing
those pulls no torch into its process; the engine process itself only through ui/engine_link.py;
ui/figures/ never imports streamlit; engine/step never imports the instruments."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UI = ("streamlit", "plotly", "ui", "app")
# What the dashboard may import of the engine (the process boundary and value types).
DASHBOARD_DOORS = {
    "engine.process.client",
    "engine.process.supervision",
    "engine.config",
    "engine.envs",
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
        ours = imported_roots(path) & {"engine", "ui", "bench", "training"}
        assert not ours, f"{path.relative_to(ROOT)} imports {sorted(ours)}"


def test_core_never_imports_torch_directly():
    for path in py_files("engine/core"):
        assert "torch" not in imported_roots(path), f"{path.relative_to(ROOT)} imports torch"


def test_the_dashboard_reaches_the_engine_only_through_its_doors():
    for path in py_files("ui", "app.py"):
        engine_mods = {m for m in imported_modules(path) if m.split(".")[0] == "engine"}
        bad = engine_mods - DASHBOARD_DOORS
        assert not bad, (
            f"{path.relative_to(ROOT)} imports {sorted(bad)}; the dashboard may import only "
            f"{sorted(DASHBOARD_DOORS)}"
        )


# The one dashboard module that holds the engine client and its process's health
# (engine.process.*); the rest of the dashboard asks it.
ENGINE_LINK = ROOT / "ui" / "engine_link.py"


def runtime_imports(path: Path) -> set[str]:
    """The absolute modules a file imports when it runs: imported_modules less the bodies of
    ``if TYPE_CHECKING:`` blocks (type hints only)."""
    mods: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.orelse:
                visit(stmt)
            return
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return mods


def test_the_dashboard_reaches_the_engine_process_only_through_the_engine_link():
    for path in py_files("ui", "app.py"):
        process = {m for m in imported_modules(path) if m.startswith("engine.process.")}
        beyond = process - {"engine.process.client", "engine.process.supervision"}
        assert not beyond, f"{path.relative_to(ROOT)} imports {sorted(beyond)}"
        if path != ENGINE_LINK:
            assert "engine.process.client" not in runtime_imports(path), (
                f"{path.relative_to(ROOT)} imports engine.process.client when it runs; pages "
                "and widgets reach the engine through ui/engine_link.py (a type hint under "
                "TYPE_CHECKING is fine)")


def test_figures_never_import_streamlit():
    for path in py_files("ui/figures"):
        assert "streamlit" not in imported_roots(path), (
            f"{path.relative_to(ROOT)} imports streamlit: a figure builder is pure (plotly "
            "and numpy); what draws belongs in ui/widgets/")


def test_step_never_imports_the_instruments():
    for path in py_files("engine/step"):
        bad = {m for m in imported_modules(path) if m.startswith("engine.instruments")}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


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


# engine/'s packages in layers, lowest first (docs/architecture.md): a module may import its
# own layer and the ones below, never one above. Top-level modules of engine/ not named here
# (engine.py, handles.py, ...) are the "engine" layer; a new package must be placed here.
ENGINE_LAYERS = [
    {"config", "core"},
    {"attention"},
    {"model"},
    {"step"},
    {"instruments"},
    {"parallel"},
    {"engine"},
    {"drivers"},
    {"process"},
    {"serving"},
    {"__main__"},
]


def engine_layer(name: str) -> int:
    """The layer of engine/<name> (a package or a top-level module's stem)."""
    for rank, names in enumerate(ENGINE_LAYERS):
        if name in names:
            return rank
    assert not (ROOT / "engine" / name).is_dir(), (
        f"engine/{name}/ is a package with no layer: add it to ENGINE_LAYERS")
    return next(r for r, names in enumerate(ENGINE_LAYERS) if "engine" in names)


def test_engine_packages_import_only_their_layer_and_below():
    for path in py_files("engine"):
        parts = path.relative_to(ROOT / "engine").parts
        own = engine_layer(parts[0] if len(parts) > 1 else path.stem)
        for mod in imported_modules(path):
            if not mod.startswith("engine.") or mod.count(".") < 1:
                continue
            target = mod.split(".")[1]
            assert engine_layer(target) <= own, (
                f"{path.relative_to(ROOT)} imports {mod}, a layer above its own "
                f"(layers, lowest first: {ENGINE_LAYERS}); inject what it needs instead")


def import_cycle(package: str) -> list[str] | None:
    """One cycle in the import graph of a package's modules (imports at any depth, so a
    function-level import that only hides a circle counts), or None."""
    graph = {}
    for path in py_files(package):
        if path.name == "__init__.py":
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        graph[name] = {m for m in imported_modules(path) if m.startswith(package + ".")}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt] if nxt in stack else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*stack, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


@pytest.mark.parametrize("package", ["ui", "telemetry"])
def test_no_import_circles(package):
    cycle = import_cycle(package)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"
