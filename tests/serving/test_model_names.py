"""The names a served model answers to: its hub id where known, its folder's name otherwise,
or the aliases --served-model-name gives, each listed by /v1/models and usable in requests."""

from __future__ import annotations

import httpx
import pytest
from serve_process import MODEL, ROOT, metric, start_server, wait_scrape

from engine.serving.model_names import accepted_names, default_name, served_names


def test_a_folder_is_served_under_its_hub_id_or_else_its_name(tmp_path):
    folder = tmp_path / "weights" / "SmolLM2-135M-Instruct"
    folder.mkdir(parents=True)
    assert default_name(str(folder)) == "SmolLM2-135M-Instruct"
    (folder / "hub_id.txt").write_text("HuggingFaceTB/SmolLM2-135M-Instruct\n")
    assert default_name(str(folder)) == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert default_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"  # a hub id: itself


def test_aliases_replace_the_default_and_the_configured_model_still_works(tmp_path):
    assert served_names("models/x", ["a", "b", "a"]) == ["a", "b"]
    assert served_names("models/x", "a") == ["a"]
    with pytest.raises(ValueError, match="may not be empty"):
        served_names("models/x", [" "])
    folder = tmp_path / "m"
    folder.mkdir()
    accepted = accepted_names(str(folder), ["a"])
    assert {"a", str(folder), str(folder.resolve())} <= accepted


def test_the_default_model_folder_names_its_hub_id():
    """scripts/fetch_default_model.py writes hub_id.txt (also into a folder made before)."""
    folder = ROOT / "models" / "SmolLM2-135M-Instruct"
    if not folder.is_dir():
        pytest.skip("the default model is not set up (bash scripts/setup.sh)")
    assert default_name(str(folder)) == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_served_model_name_aliases_over_http(tmp_path):
    srv = start_server(tmp_path, "--no-listen", "--served-model-name", "tiny", "org/tiny-v1")
    try:
        listed = httpx.get(f"{srv.url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in listed] == ["tiny", "org/tiny-v1"]
        for name in ("tiny", "org/tiny-v1", MODEL):
            r = httpx.post(f"{srv.url}/v1/completions", timeout=60, json={
                "model": name, "prompt": "import os", "max_tokens": 2})
            assert r.status_code == 200, (name, r.text)
            assert r.json()["model"] == "tiny"  # the first alias answers, as in vLLM
        r = httpx.post(f"{srv.url}/v1/completions", timeout=60,
                       json={"model": "gapless-tiny-python", "prompt": "x", "max_tokens": 1})
        assert r.status_code == 404 and "'tiny', 'org/tiny-v1'" in r.json()["error"]["message"]
        # /metrics trails the engine by up to a stats period (counters and gauges may come
        # from different reads), so the series must settle, within wait_scrape's 30 s, on
        # the three finished requests under the alias and none running.
        wait_scrape(srv.url, lambda s: metric(
            s, "vllm:request_success_total", 0.0, model_name="tiny") == 3 and metric(
            s, "vllm:num_requests_running", model_name="tiny") == 0,
            "3 finished and 0 running requests under the alias 'tiny'")
    finally:
        srv.stop()
