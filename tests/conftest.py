"""Shared fixtures: tiny models saved to disk once per session, and engine factories."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import save_tiny_model  # noqa: E402

has_cuda = torch.cuda.is_available()


# Folders whose tests share one session-long server (tests/http: `engine serve`; tests/browser:
# `streamlit run` and Chromium). They are marked as one xdist group each, meant to keep each on
# one worker. But pytest 9 ignores the group xdist 3.8 writes into the node id (it sets
# `item._nodeid`; pytest 9 reads `item._id`), so under `-n 2` the tests of a group spread over
# both workers and each worker starts its own server. scripts/test.sh therefore runs the
# browser tests in a phase of their own, in one process; tests/http's server starting twice
# costs time only.
SESSION_FOLDERS = ("http", "browser")
# Started first under xdist (--dist loadgroup): the longest units, so they run beside the
# rest instead of after it.
FIRST = ("tests/browser", "tests/http")
# Modules (or single tests, "path::name") that start engine processes (EngineClient,
# `python -m engine [serve]`, TP workers): 10-60 s per start on a 2-core VM. Marked slow
# here, so the everyday quick line (`-m "not slow and not browser"`, docs/testing.md) leaves
# them to the full line, which runs them unchanged. tests/http's tests that use the session
# `serve` process (its `server` fixture) are marked slow the same way.
STARTS_ENGINE_PROCESSES = (
    "tests/engine/test_cli.py",
    "tests/engine/test_client.py",
    "tests/engine/test_client_anatomy.py",
    "tests/http/test_client_death.py",
    "tests/http/test_engine_death.py",
    "tests/http/test_engine_silence.py",
    "tests/http/test_model_names.py::test_served_model_name_aliases_over_http",
    "tests/http/test_orphan.py",
    "tests/http/test_serve_attach.py::test_serve_attach_serves_the_dashboards_engine",
    "tests/parallel/test_tp_engine.py",
    "tests/parallel/test_tp_lifecycle.py",
    "tests/process/test_process_attach.py",
    "tests/process/test_process_hung.py",
)


def starts_engine_processes(item: pytest.Item) -> bool:
    rel = item.path.relative_to(Path(__file__).parent.parent).as_posix()
    name = getattr(item, "originalname", item.name)
    return (rel in STARTS_ENGINE_PROCESSES or f"{rel}::{name}" in STARTS_ENGINE_PROCESSES
            or (rel.startswith("tests/http/") and "server" in getattr(item, "fixturenames", ())))


def xdist_group(item: pytest.Item) -> str:
    """The unit one xdist worker runs whole: a session folder, or else the test's module
    (its module-scoped engine or model is then built once)."""
    rel = item.path.relative_to(Path(__file__).parent.parent)
    if len(rel.parts) > 2 and rel.parts[1] in SESSION_FOLDERS:
        return "/".join(rel.parts[:2])
    return rel.as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # before -m deselects (this hook runs first)
        if starts_engine_processes(item):
            item.add_marker(pytest.mark.slow)
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        for item in items:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
        # xdist hands out groups in collection order (--no-loadscope-reorder, as the README
        # line runs it); sort is stable, so the order within a group is kept.
        items.sort(key=lambda item: FIRST.index(g) if (g := xdist_group(item)) in FIRST
                   else len(FIRST))
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """family -> folder with a tiny random model and tokenizer (save_pretrained)."""
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = save_tiny_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get
