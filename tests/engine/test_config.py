"""config.yaml and EngineConfig: unknown keys and bad values name the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_and_points_at_the_shipped_model():
    cfg = EngineConfig.from_yaml(ROOT / "config.yaml")
    assert Path(cfg.model).name == "SmolLM2-135M-Instruct"
    assert cfg.async_batching is True and cfg.num_slots == 2
    assert cfg.blas_library == "auto"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("bogus", 1, "unknown engine setting 'bogus'; allowed settings: model,"),
        ("device", "tpu", "device must be one of 'cpu', 'cuda', 'auto', got 'tpu'"),
        ("dtype", "int8", "dtype must be one of"),
        ("num_slots", 4, "num_slots must be one of 1, 2, 3, got 4"),
        ("max_num_seqs", 0, "max_num_seqs must be an integer >= 1, got 0"),
        ("block_size", 12, "block_size must be a power of two from 1 to 256, got 12"),
        ("block_size", 1_048_576, "block_size must be a power of two from 1 to 256, got 1048576"),
        ("async_batching", "yes", "async_batching must be true or false, got 'yes'"),
        ("gpu_memory_fraction", 1.5, "gpu_memory_fraction must be in (0, 1], got 1.5"),
        ("attention_backend", "flash", "attention_backend must be one of"),
        ("graph_buckets", [], "graph_buckets must be a non-empty list"),
        ("blas_library", "cublasxt", "blas_library must be one of 'auto', 'default', "
         "'cublas', 'cublaslt', got 'cublasxt'"),
    ],
)
def test_bad_settings_are_named(tmp_path, key, value, message):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": "x", key: value}))
    with pytest.raises(ValueError) as exc:
        EngineConfig.from_yaml(path)
    assert message in str(exc.value)


def test_keyword_overrides_win_and_are_validated():
    cfg = EngineConfig.from_yaml(ROOT / "config.yaml", max_num_seqs=3)
    assert cfg.max_num_seqs == 3
    with pytest.raises(ValueError, match="unknown engine setting 'nope'"):
        EngineConfig.from_yaml(ROOT / "config.yaml", nope=True)


def test_missing_model_folder_is_a_clear_error(monkeypatch):
    from engine import Engine

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="could not load model 'no/such-model-here'"):
        Engine(EngineConfig(model="no/such-model-here", device="cpu"))


def test_blas_library_is_left_alone_off_cuda():
    import torch

    from engine.model.blas import apply_blas_library

    before = torch.backends.cuda.preferred_blas_library()
    assert apply_blas_library("cublaslt", torch.device("cpu")) == "n/a (cpu)"
    assert torch.backends.cuda.preferred_blas_library() == before
