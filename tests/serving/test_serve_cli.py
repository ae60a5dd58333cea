"""`python -m engine serve` refuses what it cannot serve before loading the model, with a
message and exit code 2 (tests/engine/test_cli.py covers `python -m engine PROMPT`)."""

from __future__ import annotations

import socket
import subprocess
import sys

from serve_process import ROOT


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine", "serve", "--device", "cpu", *args],
                          cwd=ROOT, text=True, capture_output=True, timeout=120)


def test_help_lists_the_options():
    p = serve("--help")
    assert p.returncode == 0
    for flag in ("--host", "--port", "--config", "--api-key", "--chat-template"):
        assert flag in p.stdout


def test_missing_config_is_an_error():
    p = serve("--config", "no/such/config.yaml")
    assert p.returncode == 2
    assert "config file 'no/such/config.yaml' does not exist" in p.stderr


def test_a_port_in_use_is_an_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = serve("--port", str(port))
    assert p.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr


def test_a_missing_chat_template_file_is_an_error():
    p = serve("--chat-template", "no_such_template.jinja")
    assert p.returncode == 2
    assert "chat template file 'no_such_template.jinja' does not exist" in p.stderr

