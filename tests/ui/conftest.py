"""Shared set-up for the dashboard tests: the repository root on sys.path, and the `fake`
fixture (a stand-in engine swapped in through ui.engine_link.make_client).

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
from fake_engine import FakeEngineClient, serve_client  # noqa: E402


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngineClient]:
    yield from serve_client(monkeypatch, FakeEngineClient())




