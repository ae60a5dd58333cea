"""config.yaml's http_port: the dashboard's own engine also serves the HTTP API, through a
`serve --attach` process (ui.http_sidecar) on the engine's socket; stopping it leaves the
engine serving its owner."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml
from serve_process import ROOT

from bench.harness import headless_chromium as headless
from engine.config import EngineConfig
from engine.process.client import EngineClient
from ui.http_sidecar import start_http_api, stop_http_api


def test_http_port_is_validated() -> None:
    with pytest.raises(ValueError, match="http_port must be null"):
        EngineConfig(http_port=0).validate()
    with pytest.raises(ValueError, match="http_port must be null"):
        EngineConfig(http_port=True).validate()


def test_serve_attach_serves_the_dashboards_engine(tmp_path) -> None:
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config.update(model=str(ROOT / "models" / "gapless-tiny-python"), device="cpu")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    sock = tmp_path / "engine" / "engine.sock"
    owner = EngineClient(str(path), listen=sock)
    proc = None
    try:
        port = headless.free_port()
        proc = start_http_api(sock, str(path), port)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, "serve --attach exited"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve --attach did not come up"
            time.sleep(0.2)
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        r = httpx.post(f"{url}/v1/completions", timeout=60, json={
            "model": model, "prompt": "import os\n", "max_tokens": 5, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        assert owner.process_info()["clients"] >= 2  # the owner and the HTTP server
    finally:
        stop_http_api(proc)
        try:
            out = owner.generate("x = ", {"max_tokens": 3, "temperature": 0.0,
                                          "ignore_eos": True}, timeout=60)
            assert len(out.token_ids) == 3  # the engine serves on without the HTTP server
        finally:
            owner.shutdown()
