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
