"""`python -m engine` generates and reports bad input as an error (on the tiny model: any
model will do, and it loads in a second)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = "models/gapless-tiny-python"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=120)


def test_cli_streams_a_completion():
    p = run("def fibonacci(n):", "--model", TINY, "--max-tokens", "8", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("def fibonacci(n):") and len(p.stdout) > len("def fibonacci(n):")
    assert "[8 tokens, length]" in p.stderr


def test_cli_rejects_bad_sampling_with_the_engine_message():
    p = run("x", "--model", TINY, "--temperature", "-1", "--device", "cpu")
    assert p.returncode == 2
    assert "temperature must be >= 0" in p.stderr


def test_cli_refuses_an_int32_overflow_before_loading(tmp_path):
    p = run("x", "--top-k", str(2**31), "--temperature", "0.5", "--device", "cpu")
    assert p.returncode == 2
    assert "top_k must be -1 (off) or an integer in [1, 2147483647]" in p.stderr


def test_cli_names_the_line_of_a_yaml_error(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("device: cpu\nmax_num_seqs: [4,\n")
    p = run("x", "--config", str(cfg))
    assert p.returncode == 2
    assert f"error: {cfg}, line " in p.stderr and "not valid YAML" in p.stderr


def test_cli_refuses_a_prompt_that_is_not_utf8():
    p = run(b"def \xff(n):".decode("utf-8", "surrogateescape"), "--model", TINY,
            "--device", "cpu")  # the tiny model: the default one loads ~10 s longer
    assert p.returncode == 2
    assert "encodes as UTF-8" in p.stderr
