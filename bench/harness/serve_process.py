"""A `python -m engine serve` process for the suites that measure serving from outside: started
with config.yaml's settings and another model, waited for until /health answers.

Owns starting it and reading its URL from its log; the caller stops it (proc.kill or terminate).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import report

ROOT = report.ROOT
LISTENING = re.compile(r"gapless: serving .* at (http://[\d.]+:\d+)/v1")
READY_TIMEOUT_S = 300.0


def start_server(tmp: Path, model: str, device: str) -> tuple[subprocess.Popen, str, Path]:
    """(the serve process, its base URL, its log file); the config and log live in `tmp`."""
    import httpx
    import yaml

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["model"] = model
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "engine", "serve", "--port", "0", "--device", device,
             "--no-listen", "--log-level", "warning", "--config", str(tmp / "config.yaml")],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {log.read_text()[-2000:]}")
        m = LISTENING.search(log.read_text(errors="replace"))
        if m:
            try:
                if httpx.get(f"{m.group(1)}/health", timeout=2).status_code == 200:
                    return proc, m.group(1), log
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"serve did not come up in {READY_TIMEOUT_S:g} s")
