"""Fixtures of the dashboard's browser tests: one `streamlit run app.py` (with its engine) and
one headless Chromium for the whole session, and per test module a tab on the Live page.

The server and the browser are shared across the modules because the engine can take
minutes to start on a 2-core CPU; each module opens its own tab. The engine's state (a
running load generator, the batching mode) passes from one module to the next as the last
test left it, so each module's tests must not count on what another module did. The browser
fixture fails the session if any tab asked for anything beyond the server.

The helpers are imported inside the fixtures: importing tests/browser/dashboard_driver.py
skips a module where Chromium or playwright is missing, which a conftest must not do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

if TYPE_CHECKING:
    from playwright import sync_api


HERE = Path(__file__).parent
# Closers of the session's browser and server, run once the last browser test of this
# process is done (see pytest_runtest_teardown).
_AT_LAST_BROWSER_TEST: list[Callable[[], None]] = []
# The tab that starts the server's engine as the browser opens (see `browser`), closed by
# the first `page` once the engine is up.
_WARMING: list[sync_api.Page] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The browser tests run after every other test. While playwright's sync API is open
    the main thread has a running asyncio loop, so a later test's asyncio.run() would fail.
    Under pytest-xdist (--dist loadgroup) the browser tests are one unit that
    tests/conftest.py starts first, on a worker of its own; there pytest_runtest_teardown
    below closes playwright before that worker's next test."""
    if getattr(config.option, "loadgroup", False):  # an xdist worker under --dist loadgroup
        return
    items.sort(key=lambda item: item.path.is_relative_to(HERE))  # stable: order kept within


@pytest.hookimpl(trylast=True)  # after the module's fixtures (the tab) are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last browser test of this process: close Chromium and playwright (its
    asyncio loop), then stop the server, rather than at the session's end."""
    if not item.path.is_relative_to(HERE):
        return
    if nextitem is None or not nextitem.path.is_relative_to(HERE):
        while _AT_LAST_BROWSER_TEST:
            _AT_LAST_BROWSER_TEST.pop()()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`streamlit run app.py` on a free port; stopped (with its engine) afterwards. It runs
    config.yaml with the tiny shipped model (fast on a 2-core CPU; the default SmolLM2's chat
    is covered by tests/ui/test_playground_chat.py)."""
    from dashboard_driver import REPO, SERVER_START_S, headless

    port = headless.free_port()
    tmp = tmp_path_factory.mktemp("streamlit")
    log_path = tmp / "server.log"
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["model"] = str(REPO / "models" / "gapless-tiny-python")
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "GAPLESS_CONFIG": str(tmp / "config.yaml")},
        start_new_session=True,  # its own process group: the engine goes down with it
    )
    url = f"http://127.0.0.1:{port}"

    def stop() -> None:
        if log.closed:
            return
        headless.stop_group(proc)  # a SIGSTOPped engine too
        log.close()
        tail = log_path.read_text(errors="replace")[-3000:]
        print(f"--- streamlit log (tail) ---\n{tail}")

    _AT_LAST_BROWSER_TEST.append(stop)
    try:
        headless.wait_healthy(url, SERVER_START_S, proc)
        yield url, proc.pid
    finally:
        stop()


@pytest.fixture(scope="session")
def browser(server: tuple[str, int]) -> Iterator[tuple[sync_api.Browser, list[str]]]:
    """One Chromium; every request a page makes beyond the server is collected. A first tab
    (on the Benchmark page: it draws no live charts) starts the server's engine at once, so
    that the engine loads while the first test runs (the attached dashboard's, with an
    engine of its own) rather than in the first `page`'s set-up (~10 s on 2 cores)."""
    from dashboard_driver import CHROMIUM_ARGS, headless, new_tab, sync_api

    url = server[0]
    outside: list[str] = []
    p = sync_api.sync_playwright().start()
    closed: list[bool] = []

    def close() -> None:
        if not closed:
            closed.append(True)
            try:
                b.close()
            finally:
                p.stop()

    try:
        b = p.chromium.launch(executable_path=str(headless.CHROMIUM), args=CHROMIUM_ARGS)
    except BaseException:
        p.stop()
        raise
    _AT_LAST_BROWSER_TEST.append(close)
    try:
        _WARMING.append(new_tab((b, outside), url.rstrip("/") + "/benchmark"))
        yield b, outside
    finally:
        close()
    assert not [u for u in outside if not u.startswith(url)], outside


@pytest.fixture(scope="module")
def page(server: tuple[str, int], browser) -> Iterator[sync_api.Page]:
    """A tab on the Live page, its timeline drawn (the engine is up), for a module's tests.
    An engine an earlier module's failed test left dead is restarted from this tab, or every
    later module would wait for charts that never come."""
    from dashboard_driver import ENGINE_START_S, TIMELINE, new_tab

    pg = new_tab(browser, server[0])
    restart = pg.get_by_role("button", name="Restart the engine")
    pg.locator(TIMELINE).or_(restart).first.wait_for(timeout=ENGINE_START_S * 1000)
    if restart.count():
        restart.first.click()
    pg.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
    while _WARMING:  # the engine is up
        _WARMING.pop().close()
    yield pg
    pg.close()
