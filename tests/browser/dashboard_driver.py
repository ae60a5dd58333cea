"""Driving the dashboard's pages in headless Chromium: the settings every browser test shares
(window sizes, where screenshots go, how long an engine may take to start) and the small
moves a test makes on a page (open a tab, go to a page, read the timeline's state, scroll,
take a screenshot, ask the Playground).

Imported by the browser tests and their conftest; importing it skips the importing test
module, with the reason, where Debian's `chromium` package (/usr/bin/chromium) or the
playwright package is missing (Playwright cannot download its own browsers here). It never
starts a server; tests/browser/conftest.py does.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from engine_procs import engine_pids  # tests/ is on sys.path (conftest.py)

from bench.harness import headless_chromium as headless

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [*headless.CHROMIUM_ARGS, *headless.BACKGROUND_TAB_ARGS]  # two-tab tests
SHOT_DIR = Path(os.environ.get("GAPLESS_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
SERVER_START_S = 60
ENGINE_START_S = 240  # the first page waits for the engine process to load the model
WIDE = {"width": 1600, "height": 1000}
SMALL = {"width": 1280, "height": 800}
TIMELINE = 'iframe[title*="live_plot"] >> nth=1'  # the history strip is nth=0

# No re-run on failure: a browser test that fails once has found a race (a test that
# passes only when re-run hides one, as the two-tab tests once hid three).
BROWSER_MARKS = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200)]

if not headless.CHROMIUM.exists():
    pytest.skip(
        f"{headless.CHROMIUM} is missing: install Debian's chromium package "
        "(apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")

# One browser and the requests its tabs made beyond the server (the `browser` fixture).
Browser = tuple[sync_api.Browser, list[str]]


def new_tab(browser: Browser, url: str, viewport: dict[str, int] = WIDE) -> sync_api.Page:
    b, outside = browser
    tab = b.new_page(viewport=viewport)
    tab.set_default_timeout(60_000)
    tab.on("request", lambda r: None if r.url.startswith(("data:", "blob:", "about:", url))
           else outside.append(r.url))
    tab.goto(url)
    return tab


def shoot(page: sync_api.Page, name: str) -> None:
    """A screenshot of what the window shows (not the whole scrolled page)."""
    SHOT_DIR.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size or WIDE
    page.screenshot(path=str(SHOT_DIR / f"{name}-{size['width']}x{size['height']}.png"))


def scroll_top(page: sync_api.Page) -> None:
    """Back to the top: Streamlit scrolls inside its own main box, not the window. Instant,
    then two frames drawn."""
    page.evaluate(
        """() => new Promise(done => {
             for (const el of [document.querySelector('[data-testid="stMain"]'),
                               document.scrollingElement])
               if (el) el.scrollTo({top: 0, left: 0, behavior: 'instant'});
             requestAnimationFrame(() => requestAnimationFrame(() => done(null)));
           })"""
    )


# Drawn and still: no skeleton or spinner; every Plotly chart (Streamlit's, and those in the
# live_plot iframes) drawn, an autosized one at its element's width; and the size and place
# of the page's charts, frames, tables and images, and the main box's height, unchanged for
# `quiet` ms. Data may change meanwhile (live charts redraw in place), geometry may not.
SETTLED_JS = """quiet => {
  if (document.querySelector('[data-testid="stSkeleton"], [data-testid="stSpinner"]'))
    return false;
  const docs = [document];
  for (const f of document.querySelectorAll('iframe')) {
    try { if (f.contentDocument) docs.push(f.contentDocument); } catch (e) {}
  }
  const parts = [];
  for (const d of docs) for (const gd of d.querySelectorAll('.js-plotly-plot')) {
    const fl = gd._fullLayout;
    if (!fl) return false;
    if (!(gd.layout && gd.layout.width) && gd.clientWidth > 0
        && Math.abs(fl.width - gd.clientWidth) > 2) return false;
    parts.push(fl.width, fl.height);
  }
  const main = document.querySelector('[data-testid="stMain"]');
  parts.push(main ? main.scrollHeight : 0, window.innerWidth, window.innerHeight);
  for (const el of document.querySelectorAll(
      'iframe, canvas, img, [data-testid="stDataFrame"], [data-testid="stPlotlyChart"]')) {
    const r = el.getBoundingClientRect();
    parts.push(Math.round(r.width), Math.round(r.height), Math.round(r.top));
  }
  const sig = parts.join(',');
  const now = performance.now();
  const s = window.__gaplessSettled;
  if (!s || s.sig !== sig) { window.__gaplessSettled = {sig, since: now}; return false; }
  return now - s.since >= quiet;
}"""


def wait_settled(page: sync_api.Page, quiet_ms: int = 500, limit_ms: int = 15_000) -> None:
    """Until the page is drawn and its layout still (SETTLED_JS), before a screenshot, in
    place of a fixed wait. A page still moving after ``limit_ms`` is shot as it is (a shot,
    not a check)."""
    page.evaluate("() => { window.__gaplessSettled = null; }")
    try:
        page.wait_for_function(SETTLED_JS, arg=quiet_ms, polling=100, timeout=limit_ms)
    except sync_api.TimeoutError:
        print(f"the page was still moving after {limit_ms} ms: shot as it was")


def body_text(page: sync_api.Page) -> str:
    return str(page.evaluate("document.body.innerText"))


def live_frames(page: sync_api.Page) -> list[sync_api.Frame]:
    """The live_plot iframes in page order: history strip, timeline, gauges."""
    handles = page.locator('iframe[title*="live_plot"]').element_handles()
    return [f for h in handles if (f := h.content_frame()) is not None]


def timeline_frame(page: sync_api.Page) -> sync_api.Frame:
    return live_frames(page)[1]


def plot_state(frame: sync_api.Frame) -> dict:
    """What the timeline's div holds: draws so far, bars drawn, lane ticks, x range."""
    return dict(frame.evaluate(
        """() => {
          const gd = document.getElementById('plot');
          const s = window.gaplessLivePlot || {};
          return {draws: s.draws || 0, error: s.error,
                  bars: gd.querySelectorAll('g.trace.bars path').length,
                  ticks: [...gd.querySelectorAll('.ytick text')].map(t => t.textContent),
                  range: gd.layout && gd.layout.xaxis ? gd.layout.xaxis.range : null,
                  title: gd.layout && gd.layout.title ? gd.layout.title.text : ''};
        }"""
    ))


def goto_page(page: sync_api.Page, title: str) -> None:
    page.get_by_role("link", name=title).first.click()
    if title == "Live":  # no heading: the timeline is the page's first thing
        page.locator(TIMELINE).wait_for()
        return
    page.wait_for_function(
        "t => [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === t)",
        arg=title,
    )


def wait_draws(frame: sync_api.Frame, more: int, limit_s: float = 30) -> dict:
    start = plot_state(frame)["draws"]
    deadline = time.monotonic() + limit_s
    while (state := plot_state(frame))["draws"] < start + more:
        assert time.monotonic() < deadline, f"only {state['draws'] - start} refreshes"
        time.sleep(0.2)
    return state


def steps_on_the_timeline(page: sync_api.Page, limit_s: float = 60) -> None:
    """Start the load generator unless it runs already, then wait until the live timeline
    draws steps: an idle engine has none to show (a test run alone starts that way)."""
    start = page.get_by_role("button", name="Start load")
    start.or_(page.get_by_role("button", name="Stop load")).first.wait_for()
    if start.count():
        start.click()
        page.get_by_role("button", name="Stop load").wait_for()
    deadline = time.monotonic() + limit_s
    while True:
        # The timeline's frame read afresh each time: right after the click's rerun the
        # iframes can be missing or replaced.
        try:
            if plot_state(timeline_frame(page))["bars"] > 0:
                return
        except (IndexError, sync_api.Error):
            pass
        assert time.monotonic() < deadline, f"no steps on the timeline after {limit_s} s of load"
        time.sleep(0.5)


def engine_pid(server_pid: int) -> int:
    """The engine process the streamlit server runs (tests/engine_procs.py)."""
    pids = engine_pids(server_pid)
    assert len(pids) == 1, f"engine processes under the streamlit server: {pids}"
    return pids[0]


def long_replies(page: sync_api.Page) -> None:
    """The longest reply the page allows, past EOS: a short reply of the tiny model (fused
    forward on the CPU) can arrive in one piece, or end before a second one starts."""
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Max new tokens")
    slider.get_by_role("slider").focus()
    slider.get_by_role("slider").press("End")
    page.get_by_text("Ignore end-of-sequence").first.click()
    page.wait_for_timeout(1000)


def ask(tab: sync_api.Page, prompt: str) -> None:
    box = tab.locator('[data-testid="stChatInputTextArea"]')
    box.fill(prompt)
    box.press("Enter")
