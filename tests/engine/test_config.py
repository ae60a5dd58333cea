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
        ("decode_layer", "five", "decode_layer must be one of 'cublas', 'fused', 'auto', "
         "got 'five'"),
        ("fused_rotary", "no", "fused_rotary must be true or false, got 'no'"),
        ("gemm_table", "no/such/table.json", "gemm_table must be null"),
        ("sentinel_sample_every", -1, "sentinel_sample_every must be an integer >= 0"),
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


@pytest.mark.parametrize("old", ["plain", "five", "persistent"])
def test_the_old_fused_layer_key_names_decode_layer(tmp_path, old):
    """A config written for the six-valued fused_layer is refused with the key that replaces
    it, its values and how the old ones map, not as an unknown key."""
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"model": "x", "fused_layer": old}))
    with pytest.raises(ValueError) as exc:
        EngineConfig.from_yaml(path)
    message = str(exc.value)
    assert "fused_layer is now decode_layer, one of 'cublas', 'fused', 'auto'" in message
    assert "five: fused" in message and "fused_rotary: false" in message
    with pytest.raises(ValueError, match="fused_layer is now decode_layer"):
        EngineConfig.from_dict({"model": "x"}, fused_layer=old)


def test_decode_layer_values_have_one_owner():
    """The model's FusedPath and the bench flags take exactly the config's values."""
    import argparse

    from bench.harness.fused_args import add_fused_arguments
    from engine.config import DECODE_LAYERS
    from engine.model.llama import FusedPath

    for layer in DECODE_LAYERS:
        assert FusedPath(layer).layer == layer
    ap = argparse.ArgumentParser()
    add_fused_arguments(ap)
    choices = next(a.choices for a in ap._actions if a.dest == "decode_layer")
    assert tuple(choices) == DECODE_LAYERS


def test_config_yaml_sets_and_comments_every_knob():
    """Every EngineConfig field is in the shipped config.yaml with a comment on its line, so a
    new knob cannot ship undocumented."""
    import dataclasses
    import re

    lines = (ROOT / "config.yaml").read_text(encoding="utf-8").splitlines()
    keyed = {m.group(1): line for line in lines if (m := re.match(r"([a-z_]+):", line))}
    for f in dataclasses.fields(EngineConfig):
        assert f.name in keyed, f"config.yaml does not set {f.name}"
        assert "#" in keyed[f.name], f"config.yaml's {f.name} has no comment on its line"


LIVE_BAD = [("async_batching", "yes"), ("num_slots", 4), ("num_slots", 2.0),
            ("cuda_graphs", 1), ("sentinel_sample_every", -1), ("sentinel_sample_every", True),
            ("max_num_batched_tokens", 0), ("max_num_batched_tokens", 64.0)]


@pytest.fixture(scope="module")
def cpu_engine(tiny_model_dir):
    from engine import Engine

    eng = Engine(EngineConfig(model=str(tiny_model_dir("llama")), device="cpu",
                              max_num_seqs=2, max_model_len=64), start=False)
    yield eng
    eng.shutdown()


@pytest.mark.parametrize(("key", "bad"), LIVE_BAD)
def test_a_live_change_is_refused_as_the_config_refuses_it(cpu_engine, key, bad):
    """One owner of the live settings' legal values: a value the config file refuses is
    refused by Engine.configure with the same words, and the settings in force stay."""
    with pytest.raises(ValueError) as from_config:
        EngineConfig(model="x", **{key: bad}).validate()
    before = cpu_engine.settings()
    with pytest.raises(ValueError) as live:
        cpu_engine.configure(**{key: bad})
    assert str(live.value) == str(from_config.value)
    assert cpu_engine.settings() == before


def test_the_live_settings_are_the_engines_configure_keywords(cpu_engine):
    """LIVE_SETTINGS names exactly what Engine.configure changes and settings() reports, the
    sentinel included."""
    import inspect

    from engine.config import LIVE_SETTINGS

    params = [p for p in inspect.signature(cpu_engine.configure).parameters if p != "self"]
    assert tuple(params) == LIVE_SETTINGS
    assert set(LIVE_SETTINGS) <= set(cpu_engine.settings())


def _literals(path: Path):
    import ast

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant)]
            if len(values) == len(node.elts):
                yield node.lineno, values


def test_live_keys_and_slot_counts_are_written_once():
    """A second list of the live settings' names, or of the legal slot counts, anywhere in the
    product fails here: readers import engine.config's LIVE_SETTINGS and NUM_SLOTS."""
    from engine.config import NUM_SLOTS

    found = []
    for part in ("engine", "ui", "app.py", "bench"):
        root = ROOT / part
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            if path == ROOT / "engine" / "config.py":
                continue
            for line, values in _literals(path):
                if {"async_batching", "num_slots"} <= set(values) or values == list(NUM_SLOTS):
                    found.append(f"{path.relative_to(ROOT)}:{line} {values}")
    assert not found, f"live keys or slot counts written outside engine/config.py: {found}"
