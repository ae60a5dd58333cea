"""scripts/fetch_default_model.py, the set-up step that makes the default model: it leaves a
finished folder alone, and a failure says what failed and what to do, leaving nothing
half-written behind. (The conversion itself is checked on its product, tests/model/test_smollm2.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine import EngineConfig
from engine.model.loader import load_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fetch_default_model.py"


def fetch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def test_an_existing_folder_is_left_alone(tmp_path: Path) -> None:
    dest = tmp_path / "SmolLM2-135M-Instruct"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep")
    p = fetch("--dest", str(dest), "--gguf", str(tmp_path / "never-read.gguf"))
    assert p.returncode == 0, p.stderr
    assert "already there" in p.stdout
    assert [f.name for f in dest.iterdir()] == ["mine.txt"]


def test_a_wrong_gguf_fails_with_the_reason_and_leaves_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(1000))
    models = tmp_path / "models"
    (models / ".SmolLM2-135M-Instruct.partial-killed" / "half").mkdir(parents=True)
    p = fetch("--dest", str(models / "SmolLM2-135M-Instruct"), "--gguf", str(bad))
    assert p.returncode == 1
    assert "sha256" in p.stderr and "run scripts/setup.sh again" in p.stderr, p.stderr
    # No destination, and no partial folder beside it (neither its own nor a killed run's).
    assert list(models.iterdir()) == []


def test_a_missing_gguf_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    p = fetch("--dest", str(tmp_path / "m" / "x"), "--gguf", str(missing))
    assert p.returncode == 1
    assert f"--gguf {missing} is not a file" in p.stderr
    assert list((tmp_path / "m").iterdir()) == []


def test_a_missing_model_folder_is_named_at_once_with_what_makes_it(monkeypatch) -> None:
    """"models/X" with a local models/ folder is a missing folder, not a hub id to retry for
    a minute (that path ends in a different message, about connecting to the hub)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = EngineConfig(model="models/No-such-model", device="cpu")
    with pytest.raises(ValueError, match="no such folder.*scripts/setup.sh"):
        load_model_and_tokenizer(cfg, torch.device("cpu"), torch.float32)
