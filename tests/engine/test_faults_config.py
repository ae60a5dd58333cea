"""Configuration mistakes end in a ValueError that says what is wrong, where, and what is
allowed, fast: YAML syntax errors with file,
line and column, duplicate keys, non-UTF-8 files, values of the wrong type, sizes that
cannot fit in memory, and model or tokenizer folders that do not exist (never a Hub
lookup)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from engine import Engine, EngineConfig
from engine.model.loader import looks_like_path


def write(tmp_path: Path, text: str | bytes, name: str = "engine.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    p = write(tmp_path, "device: cpu\nmax_num_seqs: [4,\nblock_size: 16\n")
    with pytest.raises(ValueError, match=r"engine\.yaml, line \d+, column \d+: not valid YAML"):
        EngineConfig.from_yaml(p)


def test_duplicate_keys_are_refused(tmp_path):
    p = write(tmp_path, "device: cpu\nnum_slots: 2\nnum_slots: 3\n")
    with pytest.raises(ValueError, match="line 3, column 1: .*'num_slots' is given twice"):
        EngineConfig.from_yaml(p)


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    p = write(tmp_path, b"model: \xff\xfe\n")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        EngineConfig.from_yaml(p)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("num_slots", 2.0, "num_slots must be one of 1, 2, 3, got 2.0"),
    ("nvml_interval_s", math.nan, "nvml_interval_s must be a finite number > 0"),
    ("nvml_interval_s", math.inf, "nvml_interval_s must be a finite number > 0"),
    ("seed", 2**31, "seed must be an integer in [0, 2147483647]"),
    ("graph_buckets", [8, 1024], "graph_buckets entry 1024 is above max_num_batched_tokens=512"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ValueError) as err:
        EngineConfig(**{key: value}).validate()
    assert message in str(err.value)


def test_path_like_model_strings_and_hub_ids():
    assert looks_like_path("./m") and looks_like_path("../m") and looks_like_path("/abs/m")
    assert looks_like_path("~/m") and looks_like_path("a/b/c")
    assert looks_like_path("models/does-not-exist")  # models/ is a folder here
    assert not looks_like_path("HuggingFaceTB/SmolLM2-135M")
    assert not looks_like_path("gpt2")


def test_a_missing_relative_model_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"could not load model '\./nope': no such folder"):
        Engine(EngineConfig(model="./nope", device="cpu"), start=False)
    assert time.monotonic() - t0 < 5


def test_a_bad_tokenizer_path_blames_the_tokenizer(tiny_model_dir, tmp_path):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), tokenizer=str(tmp_path / "tok"),
                       device="cpu")
    with pytest.raises(ValueError, match="could not load tokenizer") as err:
        Engine(cfg, start=False)
    assert "could not load model" not in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), tokenizer=str(empty), device="cpu")
    with pytest.raises(ValueError, match="could not load the tokenizer from .*tokenizer setting"):
        Engine(cfg, start=False)


def test_sizes_that_cannot_fit_say_how_many_bytes(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", num_blocks=10**9,
                       max_model_len=64)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"need .* GiB .* bytes\), but cpu memory has"):
        Engine(cfg, start=False)
    assert time.monotonic() - t0 < 30


def test_max_model_len_above_the_models_positions_is_refused(tiny_model_dir):
    cfg = EngineConfig(model=str(tiny_model_dir("llama")), device="cpu", max_model_len=10**7)
    with pytest.raises(ValueError, match="above the model's max_position_embeddings=512"):
        Engine(cfg, start=False)
