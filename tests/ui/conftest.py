"""Shared set-up for the dashboard tests: the repository root on sys.path.

pytest's default import mode puts only the test's own folder on sys.path; the dashboard
tests import app-level packages (ui, telemetry, engine) from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
