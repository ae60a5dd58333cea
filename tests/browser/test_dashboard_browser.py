"""The dashboard in a real browser: headless Chromium driven by Playwright against
`streamlit run app.py`, on the default model.

Checks what only a browser shows (issue 14): the timeline is within the first viewport at
1600x1000 and 1280x800; under 30 s of load, sampled every 0.5 s, the timeline is never
blank; a zoom survives 5 live refreshes; a second tab shows a mode change made in the first
within 2 s; a SIGSTOPped engine is reported within 3 s on every tab and kill-and-restart
recovers with the settings kept; the A/B view shows two timelines; a shipped recording
opens; the page makes no request beyond the server. Also: the trace download, a streamed
prompt, two tabs streaming at once, the benchmark and the requests page.

Screenshots of every page at both sizes go to artifacts/screenshots/ (ignored by git);
the README's copies in docs/screenshots/ are refreshed by hand from there (see README), so
running the tests never changes a tracked file. Needs Debian's `chromium` package
(/usr/bin/chromium); Playwright cannot download its own browsers here. Skips with the
reason when either is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ui import headless

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [*headless.CHROMIUM_ARGS, *headless.BACKGROUND_TAB_ARGS]  # two-tab tests
SHOT_DIR = Path(os.environ.get("GAPLESS_SCREENSHOTS", REPO / "artifacts" / "screenshots"))
SERVER_START_S = 60
ENGINE_START_S = 240  # the first page waits for the engine process to load the model
WIDE = {"width": 1600, "height": 1000}
SMALL = {"width": 1280, "height": 800}
TIMELINE = 'iframe[title*="live_plot"] >> nth=1'  # the history strip is nth=0

# A real browser against a live engine on a 2-core machine: a check that misses its timing
# once under load is run again (at most twice more) before it counts as failed.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1200),
              pytest.mark.flaky(reruns=2, reruns_delay=2)]

if not headless.CHROMIUM.exists():
    pytest.skip(
        f"{headless.CHROMIUM} is missing: install Debian's chromium package "
        "(apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """`streamlit run app.py` on a free port; stopped (with its engine) afterwards. It runs
    config.yaml with the tiny shipped model (fast on a 2-core CPU; the default SmolLM2's chat
    is covered by tests/ui/test_playground_chat.py)."""
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
    try:
        headless.wait_healthy(url, SERVER_START_S, proc)
        yield url, proc.pid
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)  # a stopped engine cannot exit otherwise
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()
        tail = log_path.read_text(errors="replace")[-3000:]
        print(f"--- streamlit log (tail) ---\n{tail}")


@pytest.fixture(scope="module")
def browser(server: tuple[str, int]) -> Iterator[tuple[sync_api.Browser, list[str]]]:
    """One Chromium; every request a page makes beyond the server is collected."""
    url = server[0]
    outside: list[str] = []
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(headless.CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b, outside
        finally:
            b.close()
    assert not [u for u in outside if not u.startswith(url)], outside


def new_tab(browser: tuple[sync_api.Browser, list[str]], url: str,
            viewport: dict[str, int] = WIDE) -> sync_api.Page:
    b, outside = browser
    tab = b.new_page(viewport=viewport)
    tab.set_default_timeout(60_000)
    tab.on("request", lambda r: None if r.url.startswith(("data:", "blob:", "about:", url))
           else outside.append(r.url))
    tab.goto(url)
    return tab


@pytest.fixture(scope="module")
def page(server: tuple[str, int], browser) -> Iterator[sync_api.Page]:
    pg = new_tab(browser, server[0])
    pg.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
    yield pg
    pg.close()


def shoot(page: sync_api.Page, name: str) -> None:
    """A screenshot of what the window shows (not the whole scrolled page)."""
    SHOT_DIR.mkdir(parents=True, exist_ok=True)
    size = page.viewport_size or WIDE
    page.screenshot(path=str(SHOT_DIR / f"{name}-{size['width']}x{size['height']}.png"))


def scroll_top(page: sync_api.Page) -> None:
    """Back to the top: Streamlit scrolls inside its own main box, not the window."""
    page.evaluate(
        """() => { for (const el of [document.querySelector('[data-testid="stMain"]'),
                                     document.scrollingElement]) if (el) el.scrollTo(0, 0); }"""
    )
    page.wait_for_timeout(300)


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


def engine_pid(server_pid: int) -> int:
    """The engine process: the streamlit server's child running engine.process.server."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            ppid = int(next(line.split()[1] for line in (proc / "status").read_text()
                            .splitlines() if line.startswith("PPid:")))
        except (OSError, StopIteration):
            continue
        if ppid == server_pid and b"engine.process.server" in cmd:
            return int(proc.name)
    raise AssertionError("no engine process under the streamlit server")


@pytest.mark.parametrize("viewport", [WIDE, SMALL], ids=["1600x1000", "1280x800"])
def test_timeline_is_within_the_first_viewport(server, browser, page, viewport) -> None:
    tab = new_tab(browser, server[0], viewport)
    try:
        timeline = tab.locator(TIMELINE)
        timeline.wait_for()
        box = timeline.bounding_box()
        assert box is not None
        assert box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], box
        history = tab.locator('iframe[title*="live_plot"] >> nth=0').bounding_box()
        assert history is not None and history["y"] + history["height"] <= box["y"] + 1
        ticks = plot_state(timeline_frame(tab))["ticks"]
        assert "compute" in ticks and "cpu.prepare" in ticks
    finally:
        tab.close()


def test_live_timeline_is_never_blank_under_load(page: sync_api.Page) -> None:
    page.get_by_role("button", name="Start load").click()
    page.get_by_role("button", name="Stop load").wait_for()
    frame = timeline_frame(page)
    deadline = time.monotonic() + 60
    while plot_state(frame)["bars"] == 0:  # the load's first steps arrive
        assert time.monotonic() < deadline, "no bars after 60 s of load"
        time.sleep(0.5)
    first = plot_state(frame)["draws"]
    blank, samples = [], 0
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end:
        state = plot_state(frame)
        samples += 1
        if state["bars"] == 0 or state["error"]:
            blank.append(state)
        time.sleep(0.5)
    redraws = plot_state(frame)["draws"] - first
    print(f"{samples} samples over 30 s, {redraws} live redraws, {len(blank)} blank")
    assert redraws >= 10, f"the timeline was redrawn only {redraws} times in 30 s"
    assert not blank, blank[:3]
    scroll_top(page)
    shoot(page, "live")


def test_a_zoom_survives_five_live_refreshes(page: sync_api.Page) -> None:
    frame = timeline_frame(page)
    scroll_top(page)
    box = page.locator(TIMELINE).bounding_box()
    assert box is not None and box["y"] >= 0, box
    # Drag a zoom box over the middle of the plot area, as a user does.
    y = box["y"] + box["height"] * 0.45
    page.mouse.move(box["x"] + box["width"] * 0.40, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.50, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.60, y, steps=5)
    page.mouse.up()
    page.mouse.move(5, 5)  # off the chart: live updates resume
    zoomed = plot_state(frame)["range"]
    assert zoomed is not None and zoomed[0] > -1000 + 1, f"the drag did not zoom: {zoomed}"
    state = wait_draws(frame, 5)
    assert state["range"] == pytest.approx(zoomed), (zoomed, state["range"])
    assert state["bars"] > 0
    frame.evaluate("() => Plotly.relayout(document.getElementById('plot'), "
                   "{'xaxis.autorange': true})")  # leave it unzoomed for the next tests


def test_hover_label_stays_while_the_pointer_is_on_the_chart(page: sync_api.Page) -> None:
    frame = timeline_frame(page)
    scroll_top(page)
    box = page.locator(TIMELINE).bounding_box()
    assert box is not None
    before = frame.evaluate("window.gaplessLivePlot.holds")
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.45)
    time.sleep(3.5)  # three live refreshes arrive meanwhile
    held = frame.evaluate("window.gaplessLivePlot.holds") - before
    page.mouse.move(5, 5)
    assert held >= 2, f"only {held} refreshes were held while hovering"


@pytest.mark.skip(reason="flaky since the merges: the download event did not come within 60 s in "
                         "2 of 4 runs on 2026-12-02 (once alone); cause not found yet")
def test_trace_download_is_a_chrome_trace_of_the_steps_on_screen(page: sync_api.Page) -> None:
    page.get_by_role("button", name="Pause to download the Chrome trace").click()
    button = page.get_by_role("button", name="Download the Chrome trace of the steps on screen")
    button.wait_for()
    deadline = time.monotonic() + 30
    while not (title := plot_state(timeline_frame(page))["title"]).startswith("Paused"):
        assert time.monotonic() < deadline, title
        time.sleep(0.3)
    with page.expect_download(timeout=60_000) as info:
        button.click()
    download = info.value
    assert download.suggested_filename.startswith("gapless-steps-"), download.suggested_filename
    trace = json.loads(Path(download.path()).read_bytes())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {"compute", "cpu.prepare"} <= {e["cat"] for e in spans}
    shown = int(title.split()[1])  # "Paused: N steps in the last ..."
    assert len({e["args"]["step"] for e in spans}) == shown
    page.get_by_text("Pause", exact=True).click()  # back to live
    page.get_by_role("button", name="Pause to download the Chrome trace").wait_for()


def test_a_second_tab_shows_a_mode_change_within_two_seconds(server, browser, page) -> None:
    other = new_tab(browser, server[0].rstrip("/") + "/benchmark")  # no charts to load
    try:
        other.get_by_role("heading", name="Benchmark").wait_for()
        before = "async" if "mode async" in body_text(page) else "sync"
        after = "sync" if before == "async" else "async"
        other.wait_for_function("m => document.body.innerText.includes(m)", arg=f"mode {before}")
        # Both tabs are watched from here at once: the change is made when the first tab
        # shows it (its click waits for the engine's next step boundary); the other tab
        # must follow within 2 s of that.
        for tab in (page, other):
            tab.evaluate(
                """m => { window.__seen = null; const o = new MutationObserver(() => {
                      if (window.__seen === null && document.body.innerText.includes(m))
                        window.__seen = Date.now(); });
                      o.observe(document.body, {subtree: true, childList: true,
                                                characterData: true}); }""",
                f"mode {after}",
            )
        page.get_by_text("Async batching").first.click()
        for tab in (page, other):
            tab.wait_for_function("() => window.__seen !== null", timeout=30_000)
        lag = (other.evaluate("window.__seen") - page.evaluate("window.__seen")) / 1000
        print(f"the other tab showed mode {after} {lag:.2f} s after the first tab")
        assert lag < 2.0, f"the other tab followed {lag:.2f} s after the change"
        page.get_by_text("Async batching").first.click()  # back
        page.wait_for_function("m => document.body.innerText.includes(m)", arg=f"mode {before}")
    finally:
        other.close()


def test_a_stopped_engine_is_reported_and_restart_recovers(server, browser, page) -> None:
    if "mode async" in body_text(page):  # sync: not config.yaml's, so a restart must keep it
        page.get_by_text("Async batching").first.click()
    page.wait_for_function("() => document.body.innerText.includes('mode sync')")
    pid = engine_pid(server[1])
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        page.wait_for_function(
            "() => document.body.innerText.includes('The engine is not responding')",
            timeout=15_000,
        )
        took = time.monotonic() - t0
        fresh = new_tab(browser, server[0])  # a new tab does not stay blank
        fresh.wait_for_function(
            "() => document.body.innerText.includes('The engine is not responding')",
            timeout=15_000,
        )
        fresh.close()
        print(f"SIGSTOP reported after {took:.2f} s")
        assert took <= 3.0, f"the hang was reported after {took:.2f} s"
        page.get_by_role("button", name="Kill and restart the engine").first.click()
        page.wait_for_function(
            "() => !document.body.innerText.includes('not responding') && "
            "document.body.innerText.includes('mode sync')",
            timeout=ENGINE_START_S * 1000,
        )
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert engine_pid(server[1]) != pid
    page.locator(TIMELINE).wait_for()
    page.get_by_text("Async batching").first.click()  # back to the default
    page.wait_for_function("() => document.body.innerText.includes('mode async')")


def test_ab_view_shows_two_timelines(page: sync_api.Page) -> None:
    goto_page(page, "A/B")
    page.get_by_role("button", name="Compare sync and async").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p =>
             [...p.querySelectorAll('.ytick text')].some(t => t.textContent === 'compute'))
             .length === 2""",
        timeout=120_000,
    )
    text = body_text(page)
    assert "steps/s" in text and ("no measurable difference" in text or "better" in text)
    page.wait_for_timeout(1000)
    shoot(page, "ab")


def test_a_shipped_recording_opens(page: sync_api.Page) -> None:
    goto_page(page, "Recordings")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p =>
             [...p.querySelectorAll('.ytick text')].some(t => t.textContent === 'compute'))
             .length === 2""",
        timeout=60_000,
    )
    assert "commit" in body_text(page)
    page.wait_for_timeout(1000)
    shoot(page, "recordings")


def long_replies(page: sync_api.Page) -> None:
    """The longest reply the page allows, past EOS: a short reply of the tiny model (fused
    forward on the CPU) can arrive in one piece, or end before a second one starts."""
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Max new tokens")
    slider.get_by_role("slider").focus()
    slider.get_by_role("slider").press("End")
    page.get_by_text("Ignore end-of-sequence").first.click()
    page.wait_for_timeout(1000)


def test_playground_prompt_streams_back_text(page: sync_api.Page) -> None:
    goto_page(page, "Playground")
    page.evaluate(
        """() => {
          window.__replyLengths = [];
          const seen = () => {
            const msgs = document.querySelectorAll('[data-testid="stChatMessage"]');
            const last = msgs[msgs.length - 1];
            const code = last && last.querySelector('code');
            if (code) window.__replyLengths.push(code.textContent.length);
          };
          new MutationObserver(seen).observe(document.body,
            {subtree: true, childList: true, characterData: true});
        }"""
    )
    long_replies(page)
    box = page.locator('[data-testid="stChatInputTextArea"]')
    box.fill("def fibonacci(n):")
    box.press("Enter")
    page.wait_for_function(
        "() => document.body.innerText.includes('TTFT') && window.__replyLengths.length > 0",
        timeout=120_000,
    )
    lengths = page.evaluate("window.__replyLengths")
    distinct = sorted({n for n in lengths if n > 0})
    assert len(distinct) >= 2, f"the reply appeared at once, not streamed: lengths {distinct}"
    shoot(page, "playground")


REPLY_TIMES_JS = """() => {
  const replies = () => document.querySelectorAll('[data-testid="stChatMessage"] code').length;
  const figures = () => document.body.innerText.split('TTFT').length - 1;
  const before = {replies: replies(), figures: figures()};
  window.__firstText = null; window.__done = null;
  if (window.__replyObserver) window.__replyObserver.disconnect();
  window.__replyObserver = new MutationObserver(() => {
    if (window.__firstText === null && replies() > before.replies) {
      const codes = document.querySelectorAll('[data-testid="stChatMessage"] code');
      if (codes[codes.length - 1].textContent.length) window.__firstText = Date.now();
    }
    if (window.__done === null && figures() > before.figures) window.__done = Date.now();
  });
  window.__replyObserver.observe(document.body,
    {subtree: true, childList: true, characterData: true});
}"""


def ask(tab: sync_api.Page, prompt: str) -> None:
    box = tab.locator('[data-testid="stChatInputTextArea"]')
    box.fill(prompt)
    box.press("Enter")


def test_two_tabs_stream_at_the_same_time(server, browser, page) -> None:
    """Two browser tabs (two sessions), one prompt each: both replies stream together."""
    tabs = [new_tab(browser, server[0].rstrip("/") + "/playground") for _ in range(2)]
    try:
        for tab in tabs:
            tab.set_default_timeout(120_000)
            tab.locator('[data-testid="stChatInputTextArea"]').wait_for()
            tab.evaluate(REPLY_TIMES_JS)
            ask(tab, "import sys")
            tab.wait_for_function("() => window.__done !== null")
        for tab in tabs:
            long_replies(tab)
            tab.evaluate(REPLY_TIMES_JS)
        for tab, prompt in zip(tabs, ("import os", "class Stack:"), strict=True):
            ask(tab, prompt)
        for tab in tabs:
            tab.wait_for_function("() => window.__done !== null")
        spans = [tab.evaluate("[window.__firstText, window.__done]") for tab in tabs]
        (a0, a1), (b0, b1) = spans
        assert a0 is not None and b0 is not None, spans
        assert a0 < b1 and b0 < a1, f"the replies did not overlap: {spans}"
    finally:
        for tab in tabs:
            tab.close()


def test_benchmark_alternates_modes_and_reports_the_spread(server, browser, page) -> None:
    goto_page(page, "Live")
    if page.get_by_role("button", name="Stop load").count():
        page.get_by_role("button", name="Stop load").click()
        page.get_by_role("button", name="Start load").wait_for()
    goto_page(page, "Benchmark")
    page.get_by_label("Repetitions per mode").fill("2")  # 2 x 2 runs: enough to alternate
    page.get_by_label("Repetitions per mode").press("Enter")
    page.wait_for_timeout(1000)
    page.get_by_role("button", name="Run the benchmark").click()
    other = new_tab(browser, server[0].rstrip("/") + "/requests")  # another page says so
    try:
        other.wait_for_function(
            "() => document.body.innerText.includes('A benchmark is running')", timeout=30_000)
    finally:
        other.close()
    page.wait_for_function("() => document.body.innerText.includes('requests finished')")
    page.get_by_role("heading", name="Results").wait_for(timeout=900_000)
    page.wait_for_timeout(1500)
    text = body_text(page)
    assert "total time" in text and ("no measurable difference" in text or "better" in text)
    shoot(page, "benchmark")


def test_requests_page_lists_the_requests(page: sync_api.Page) -> None:
    goto_page(page, "Requests")
    page.locator('[data-testid="stDataFrame"]').wait_for()
    page.wait_for_timeout(1500)
    assert "time to first token" in body_text(page)
    shoot(page, "requests")


PAGES = ("Live", "Playground", "Benchmark", "A/B", "Recordings", "Requests")


@pytest.mark.parametrize("viewport", [WIDE, SMALL], ids=["1600x1000", "1280x800"])
def test_screenshots_of_every_page(server, browser, page, viewport) -> None:
    """Every page as a window of that size shows it, for the README (artifacts/ only)."""
    tab = new_tab(browser, server[0], viewport)
    try:
        tab.locator(TIMELINE).wait_for()
        tab.get_by_role("button", name="Start load").click()  # something to look at
        tab.wait_for_timeout(4000)
        scroll_top(tab)
        for title in PAGES:
            if title != "Live":
                goto_page(tab, title)
            tab.wait_for_timeout(4000)  # tables draw a moment after the page
            scroll_top(tab)
            name = title.lower().replace("/", "")
            shoot(tab, f"page-{name}")
        goto_page(tab, "Live")
        tab.get_by_role("button", name="Stop load").click()
    finally:
        tab.close()
