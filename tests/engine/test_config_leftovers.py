"""Config mistakes a user makes, each a clear error at once: a config without
`model:` run from another folder, a config path that is a directory, an absurd block_size."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engine import config as config_module
from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


def test_config_without_model_uses_the_repository_default_from_any_folder(tmp_path,
                                                                           monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"max_num_seqs": 4}))
    monkeypatch.chdir(tmp_path)  # not the repository: models/ is not here
    cfg = EngineConfig.from_yaml(path)
    assert Path(cfg.model) == ROOT / "models" / "SmolLM2-135M-Instruct"


def test_config_without_model_and_no_default_folder_says_so(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"max_num_seqs": 4}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config_module, "REPO_ROOT", tmp_path / "no-repo")
    with pytest.raises(ValueError) as exc:
        EngineConfig.from_yaml(path)
    message = str(exc.value)
    assert "no model: set" in message and "models/SmolLM2-135M-Instruct" in message
    assert "scripts/setup.sh" in message


def test_serve_with_a_config_without_model_fails_fast_from_another_folder(tmp_path):
    # The probe: 51 s of hub lookup, then an unclear error. Now: the default folder is found
    # (or named) without the network; here the model folder is missing on purpose.
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"max_num_seqs": 4, "model": str(tmp_path / "gone")}))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0", "--config",
                        str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                            "HF_HUB_OFFLINE": "0"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert "gone" in r.stderr and "error:" in r.stderr
    assert time.monotonic() - t0 < 60  # no hub lookup: seconds, even on a loaded machine


def test_config_path_that_is_a_directory_says_so(tmp_path):
    with pytest.raises(ValueError) as exc:
        EngineConfig.from_yaml(tmp_path)
    assert "is a directory" in str(exc.value) and "config.yaml" in str(exc.value)


def test_absurd_block_size_refused_with_what_is_allowed():
    with pytest.raises(ValueError) as exc:
        EngineConfig(model="x", block_size=1_048_576).validate()
    assert "block_size must be a power of two from 1 to 256, got 1048576" in str(exc.value)
    EngineConfig(model="x", block_size=256).validate()
