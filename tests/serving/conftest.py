"""Fixtures of tests/serving: one `python -m engine serve` on the default CPU model for the
session, the openai client pointed at it, and the model's tokenizer.

The model has no chat template of its own, so the shared server is started with
--chat-template (a server operator's way to serve such a model).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from serve_process import Server

# The GPU machine has no network and none of the HTTP packages: leave tests/serving out there,
# and say so in the header, rather than fail on imports.
NEEDED = ("fastapi", "uvicorn", "prometheus_client", "openai", "httpx")
MISSING = [m for m in NEEDED if importlib.util.find_spec(m) is None]
if MISSING:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config: pytest.Config) -> str | None:
    if MISSING:
        return (f"tests/serving not collected: {', '.join(MISSING)} not installed "
                "(pip install -r requirements-dev.txt)")
    return None


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    from serve_process import API_KEY, BODY_TIMEOUT_S, CHAT_TEMPLATE, HEADER_TIMEOUT_S, start_server

    from engine import envs

    tmp = tmp_path_factory.mktemp("serve")
    template = tmp / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATE)
    # Short read deadlines so that the slow-client tests (test_timeouts.py) take seconds.
    srv = start_server(tmp, "--chat-template", str(template), "--header-timeout",
                       str(HEADER_TIMEOUT_S), "--body-timeout", str(BODY_TIMEOUT_S),
                       env={envs.GAPLESS_API_KEY: API_KEY})
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tokenizer():
    from serve_process import CHAT_TEMPLATE, MODEL, ROOT
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / MODEL, local_files_only=True)
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture
def oai(server: Server):
    from openai import OpenAI
    from serve_process import API_KEY

    with OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0,
                timeout=60) as client:
        yield client
