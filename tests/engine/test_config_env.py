"""The GAPLESS_* environment variables: one registry (engine/envs.py) names them all, parses
them, and is the only module that spells a name; a bad value is an error naming the variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine import envs

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("engine", "telemetry", "ui", "app.py", "bench", "scripts")
NAME = re.compile(r"\bGAPLESS_[A-Z0-9_]*[A-Z0-9]\b")


def product_files() -> list[Path]:
    files: list[Path] = []
    for part in PRODUCT:
        p = ROOT / part
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix in (".py", ".sh"))
        elif p.is_file():
            files.append(p)
    return files


def test_every_variable_the_product_mentions_is_registered():
    """A new switch read from the environment, or one left in a comment after it went, fails
    here: it is either a registered deployment variable or a config key."""
    unknown = {}
    for path in product_files():
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            if name not in envs.ENV_VARS:
                unknown.setdefault(name, path.relative_to(ROOT).as_posix())
    assert not unknown, f"GAPLESS_* names outside engine/envs.py's registry: {unknown}"


def test_only_the_registry_spells_a_variable_name():
    """Readers and writers take the name from engine/envs.py, so a rename or a parse rule has
    one place: a string that is exactly a GAPLESS_* name appears nowhere else."""
    spelled = []
    for path in product_files():
        if path.suffix != ".py" or path == ROOT / "engine" / "envs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.fullmatch(node.value):
                spelled.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno}")
    assert not spelled, f"GAPLESS_* names spelled outside engine/envs.py: {spelled}"


def test_values_are_parsed_and_bad_ones_named(monkeypatch):
    monkeypatch.delenv(envs.GAPLESS_ENGINE_FORKSERVER, raising=False)
    assert envs.get(envs.GAPLESS_ENGINE_FORKSERVER) is True
    monkeypatch.setenv(envs.GAPLESS_ENGINE_FORKSERVER, "0")
    assert envs.get(envs.GAPLESS_ENGINE_FORKSERVER) is False
    monkeypatch.setenv(envs.GAPLESS_ENGINE_FORKSERVER, "sometimes")
    with pytest.raises(ValueError, match="GAPLESS_ENGINE_FORKSERVER must be 1 or 0"):
        envs.get(envs.GAPLESS_ENGINE_FORKSERVER)
    monkeypatch.setenv(envs.GAPLESS_CACHE, "~/elsewhere")
    assert envs.get(envs.GAPLESS_CACHE) == Path.home() / "elsewhere"
    monkeypatch.setenv(envs.GAPLESS_API_KEY, "")
    assert envs.get(envs.GAPLESS_API_KEY) is None  # empty is unset
    with pytest.raises(ValueError, match="'GAPLESS_FUSED_TABLE' is not an environment variable"):
        envs.get("GAPLESS_FUSED_TABLE")
    assert all(v.meaning for v in envs.ENV_VARS.values())
