"""Shared fixtures: tiny models saved to disk once per session, and engine factories."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# One CPU thread per process for torch's (OpenMP's) intra-op work under pytest-xdist: each
# worker (and the engine processes it starts, which inherit this) otherwise runs a thread per
# core, and the spinning threads of several pools on the same cores slow each other down.
# Set before torch is imported (it reads it then); a caller's value is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from interpreter_child import BUDGET_S as INTERPRETER_BUDGET_S  # noqa: E402
from interpreter_child import PARENTS as INTERPRETER_PARENTS  # noqa: E402
from interpreter_child import UNIT as INTERPRETER_UNIT  # noqa: E402
from tiny_models import save_tiny_model  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":  # a kernel test's interpreter child
    from triton_interpreter_calls import install  # noqa: E402

    install()

has_cuda = torch.cuda.is_available()


# Folders whose tests share one session-long server (tests/serving: `engine serve`; tests/browser:
# `streamlit run`, its engine and Chromium): under `--dist loadgroup` each folder is one unit of
# work, run whole by one xdist worker; every other test module is a unit of its own (its
# module-scoped engines and compiled models are then built once, not once per worker).
# pytest 9 ignores the group xdist 3.8 writes into the node id (xdist sets `item._nodeid`;
# pytest 9 reads `item._id`), so the scheduler below derives the unit from the node id itself.
SESSION_FOLDERS = ("serving", "browser")
# tests/serving modules that never use the session `serve` (its `server` fixture): each starts
# servers of its own (an engine to kill, stop or orphan) or none, so each is a unit of its own
# beside the folder's, and the folder's one unit (the critical path of phase 1) is not made
# to wait for them. pytest_collection_modifyitems checks
# that none of their tests asks for `server` (a second worker would start a second serve).
OWN_SERVER_MODULES = tuple(f"tests/serving/{m}.py" for m in (
    "test_background_server", "test_client_death", "test_engine_death", "test_engine_silence",
    "test_metrics_sentinel", "test_model_names", "test_orphan", "test_serve_attach",
    "test_serve_cli", "test_token_budget_serve"))
# Handed out first under xdist, in this order (a worker takes the next unit when it runs
# dry): the longest units, longest first, so that no long one starts last. The browser tests
# run in a phase of their own in scripts/test.sh (a plain `-n 2 --dist loadgroup` run puts
# them first, on one worker, beside the rest). The kernel test modules share one interpreter
# child (INTERPRETER_UNIT), so each of them alone is a short unit.
FIRST = (
    "tests/browser",
    INTERPRETER_UNIT,  # the interpreter children of the kernel tests
    "tests/serving",  # one `engine serve` for all of it (OWN_SERVER_MODULES apart)
    "tests/process/test_client.py",
    "tests/model/test_smollm2.py",
    "tests/serving/test_engine_silence.py",
    "tests/engine/test_stalls_engine.py",
    "tests/model/test_compiled_generic.py",
    "tests/process/test_process_hung.py",
    "tests/ui/test_pages_engine.py",
    "tests/process/test_process_attach.py",
    "tests/model/test_fused_greedy.py",
    "tests/serving/test_serve_attach.py",
    "tests/serving/test_orphan.py",
    "tests/engine/test_cli.py",
    "tests/ui/test_playground_chat.py",
    "tests/parallel/test_tp_engine.py",
    "tests/process/test_client_anatomy.py",
    "tests/serving/test_engine_death.py",
    "tests/ui/test_pages_monitoring.py",
    "tests/ui/test_pages_fake.py",
    "tests/step/test_async_pipeline.py",
    "tests/parallel/test_tp_lifecycle.py",
    "tests/core/test_prefix_cache.py",
    "tests/ui/test_playground_engine.py",
    "tests/serving/test_model_names.py",
    "tests/ui/test_requests_ledger.py",
)

# Modules (or single tests, "path::name") that start engine processes (EngineClient,
# `python -m engine [serve]`, TP workers): seconds per start on a small CPU. Marked slow
# here, so the everyday quick line (`-m "not slow and not browser"`, docs/testing.md) leaves
# them to the full line, which runs them unchanged. tests/serving's tests that use the session
# `serve` process (its `server` fixture) are marked slow the same way.
STARTS_ENGINE_PROCESSES = (
    "tests/engine/test_cli.py",
    "tests/process/test_client.py",
    "tests/process/test_client_anatomy.py",
    "tests/serving/test_client_death.py",
    "tests/serving/test_engine_death.py",
    "tests/serving/test_engine_silence.py",
    "tests/serving/test_model_names.py::test_served_model_name_aliases_over_http",
    "tests/serving/test_orphan.py",
    "tests/serving/test_serve_attach.py::test_serve_attach_serves_the_dashboards_engine",
    "tests/parallel/test_tp_engine.py",
    "tests/parallel/test_tp_lifecycle.py",
    "tests/process/test_forkserver.py",
    "tests/process/test_process_attach.py",
    "tests/process/test_process_hung.py",
)


# Units that only compute (no engine process, server, browser or clock in their checks), run
# by scripts/test.sh beside the browser tests at nice +19 rather than in phase 1: phase 1 is
# bound by CPU, the browser phase leaves most of a core idle. Marked `background` here.
BACKGROUND_UNITS = (
    INTERPRETER_UNIT,  # the Triton-interpreter child: one thread, compute only
    "tests/model/test_compiled_generic.py",  # torch.compile on CPU
    "tests/model/test_fused_greedy.py",
    "tests/model/test_smollm2.py",  # the default model against the GGUF it came from
)


def starts_engine_processes(item: pytest.Item) -> bool:
    rel = item.path.relative_to(Path(__file__).parent.parent).as_posix()
    name = getattr(item, "originalname", item.name)
    return (rel in STARTS_ENGINE_PROCESSES or f"{rel}::{name}" in STARTS_ENGINE_PROCESSES
            or (rel.startswith("tests/serving/") and "server" in getattr(item, "fixturenames", ())))


def unit_of(nodeid: str) -> str:
    """The unit one xdist worker runs whole: the interpreter child's parent tests together
    (tests/interpreter_child.py runs one child for all of them), a session folder (less its
    OWN_SERVER_MODULES), or else the test's module."""
    if nodeid in INTERPRETER_PARENTS:
        return INTERPRETER_UNIT
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[1] in SESSION_FOLDERS and path not in OWN_SERVER_MODULES:
        return "/".join(parts[:2])
    return "/".join(parts)


def xdist_group(item: pytest.Item) -> str:
    return unit_of(item.nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 (xdist's type)
    """Under `--dist loadgroup`: xdist's group scheduler, with each test's unit read from its
    node id (unit_of) where the node id carries no xdist group (pytest 9, see above)."""
    if config.getoption("dist", None) != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class UnitScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:  # a pytest that keeps xdist's group in the node id
                return super()._split_scope(nodeid)
            return unit_of(nodeid)

    return UnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # before -m deselects (this hook runs first)
        if starts_engine_processes(item):
            item.add_marker(pytest.mark.slow)
        if xdist_group(item) in BACKGROUND_UNITS:
            item.add_marker(pytest.mark.background)
        if item.nodeid in INTERPRETER_PARENTS:
            # Whichever parent runs first runs the one interpreter child for all of them, with
            # the sum of their budgets: the parent may take that long, not the default limit.
            item.add_marker(pytest.mark.timeout(INTERPRETER_BUDGET_S + 60))
        if xdist_group(item) in OWN_SERVER_MODULES and "server" in item.fixturenames:
            raise pytest.UsageError(
                f"{item.nodeid} uses the session `serve` (fixture `server`): remove its module "
                "from tests/conftest.py's OWN_SERVER_MODULES, or start a server of its own")
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


# This process's own __main__ (pytest's, or an xdist worker's), as it was at start.
MAIN_MODULE = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _keep_main_module():
    """Put this process's own sys.modules["__main__"] back around each test. Streamlit's
    script runner (AppTest, tests/ui) installs app.py as __main__ and leaves it there; a later
    test in the same process that starts tensor-parallel workers (multiprocessing spawn
    re-imports __main__ in each child) then ran app.py in the workers, which died (seen when
    an xdist worker ran tests/ui before tests/parallel)."""
    sys.modules["__main__"] = MAIN_MODULE
    yield
    sys.modules["__main__"] = MAIN_MODULE


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """family -> folder with a tiny random model and tokenizer (save_pretrained)."""
    cache: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in cache:
            cache[family] = save_tiny_model(family, tmp_path_factory.mktemp(family))
        return cache[family]

    return get
