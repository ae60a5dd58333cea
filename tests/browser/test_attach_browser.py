"""The dashboard attached to a running `python -m engine serve`: HTTP clients'
requests show on the Live timeline and the Requests page of a dashboard that did not start
the engine (GAPLESS_ENGINE_SOCKET names the serve process's engine socket)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.harness import headless_chromium as headless

REPO = Path(__file__).resolve().parents[2]
# No re-run on failure (tests/browser/dashboard_driver.py's BROWSER_MARKS says why).
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

if not headless.CHROMIUM.exists():
    pytest.skip(f"{headless.CHROMIUM} is missing: install Debian's chromium package",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
httpx = pytest.importorskip("httpx", reason="the HTTP test packages are missing")
pytest.importorskip("fastapi", reason="the HTTP packages are missing")

SERVING = re.compile(r"gapless: serving .* at (http://[\d.]+:\d+)/v1")


@pytest.fixture(scope="module")
def serve_and_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A serve process on the tiny model with its engine socket, and `streamlit run app.py`
    attached to it. Yields (API base URL, dashboard URL)."""
    tmp = tmp_path_factory.mktemp("attach")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["model"] = str(REPO / "models" / "gapless-tiny-python")
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    sock = tmp / "engine" / "engine.sock"
    serve_log = (tmp / "serve.log").open("wb")
    serve = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--port", "0", "--device", "cpu",
         "--config", str(tmp / "config.yaml"), "--listen", str(sock), "--log-level", "warning"],
        cwd=REPO, stdout=serve_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True)
    dash = None
    try:
        api = None
        deadline = time.monotonic() + 240
        while api is None and time.monotonic() < deadline:
            assert serve.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            m = SERVING.search((tmp / "serve.log").read_text(errors="replace"))
            api = m.group(1) if m else None
            time.sleep(0.2)
        assert api is not None and sock.exists(), (tmp / "serve.log").read_text()[-3000:]
        port = headless.free_port()
        dash_log = (tmp / "streamlit.log").open("wb")
        dash = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)],
            cwd=REPO, stdout=dash_log, stderr=subprocess.STDOUT,
            env={**os.environ, "GAPLESS_ENGINE_SOCKET": str(sock)}, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        headless.wait_healthy(url, 60, dash)
        yield api, url
    finally:
        if dash is not None:
            headless.stop_group(dash)
        headless.stop_group(serve)


def test_http_requests_show_on_the_attached_dashboard(serve_and_dashboard, browser) -> None:
    """In a tab of the session's Chromium, so that a request beyond this dashboard fails
    the session as for the others."""
    from dashboard_driver import new_tab

    api, url = serve_and_dashboard
    page = new_tab(browser, url)
    try:
        page.set_default_timeout(120_000)
        page.locator('iframe[title*="live_plot"] >> nth=1').wait_for()
        assert "gapless-tiny-python" in page.evaluate("document.body.innerText")
        model = httpx.get(f"{api}/v1/models", timeout=30).json()["data"][0]["id"]
        n = 5
        for i in range(n):  # the dashboard's bus mirror sees what comes after it attached
            r = httpx.post(f"{api}/v1/completions", timeout=120, json={
                "model": model, "prompt": f"def f{i}(x):\n",
                "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
        # Live: the timeline draws the HTTP requests' steps (bars on the compute lane).
        frame = page.frame_locator('iframe[title*="live_plot"] >> nth=1')
        frame.locator(".plot-container").wait_for()
        page.get_by_role("link", name="Requests").first.click()
        page.wait_for_function(
            "n => /requests seen\\s*\\n?\\s*(\\d+)/.test(document.body.innerText) && "
            "Number(document.body.innerText.match(/requests seen\\s*\\n?\\s*(\\d+)/)[1]) >= n"
            " && Number(document.body.innerText.match(/finished\\s*\\n?\\s*(\\d+)/)[1]) >= n",
            arg=n, timeout=60_000)
        shots = Path(os.environ.get("GAPLESS_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shots / "attached-requests.png"), full_page=True)
    finally:
        page.close()
