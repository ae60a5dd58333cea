"""Shared set-up for the dashboard tests: the repository root on sys.path, and the `fake`
fixture (a stand-in engine swapped in through ui.client.make_client).

pytest's default import mode puts only the test's own folder on sys.path; the dashboard
tests import app-level packages (ui, telemetry, engine) from the repository root.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pytest  # noqa: E402
import streamlit as st  # noqa: E402
from fake_engine import FakeEngineClient  # noqa: E402

import ui.bench_runner  # noqa: E402
import ui.client  # noqa: E402
import ui.status  # noqa: E402


def reset_shared_state() -> None:
    """Server-wide state (one per Streamlit process) must not leak between tests."""
    ui.bench_runner.RUNS.current = None
    ui.status.REMEMBERED.settings = {}
    ui.status.HANG.answered()
    ui.status.stop_watchdogs()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngineClient]:
    client = FakeEngineClient()
    st.cache_resource.clear()
    reset_shared_state()
    monkeypatch.setattr(ui.client, "make_client", lambda: client)
    yield client
    st.cache_resource.clear()
    reset_shared_state()




