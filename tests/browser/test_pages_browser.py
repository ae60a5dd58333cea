"""The dashboard's other pages in a real browser: the A/B view shows two timelines,
a shipped recording opens, the benchmark alternates the modes and reports the spread, the
Requests page lists the requests; and a screenshot of every page at both window sizes.

Screenshots go to artifacts/screenshots/ (ignored by git); the README's copies in
docs/screenshots/ are refreshed by hand from there (see README), so running the tests never
changes a tracked file. Beside each first-screen shot, ``*-whole-*.png`` holds the whole
scrolled page at that window's width: where a cut table column or a legend with its own
scroll bar would show.
"""

from __future__ import annotations

import re

from dashboard_driver import (  # skips this module where there is no browser
    BROWSER_MARKS,
    ENGINE_START_S,
    SHOT_DIR,
    SMALL,
    TIMELINE,
    WIDE,
    body_text,
    goto_page,
    new_tab,
    scroll_top,
    shoot,
    steps_on_the_timeline,
    sync_api,
    timeline_frame,
    wait_settled,
)

pytestmark = BROWSER_MARKS
WHOLE_PAGE_MAX_PX = 8000  # taller pages are cut there (a shot, not a test)


def shoot_whole_page(page: sync_api.Page, name: str, settle: bool = True) -> None:
    """The whole page, scrolled or not, as a window of this width shows it: the window is
    made as tall as Streamlit's main box for the shot, then put back (and left to redraw
    unless ``settle`` is False, where the caller resizes or waits next anyway)."""
    size = page.viewport_size
    assert size is not None
    tall = int(page.evaluate(
        """() => { const m = document.querySelector('[data-testid="stMain"]');
                   return m ? m.scrollHeight : document.body.scrollHeight; }"""))
    height = min(max(tall, size["height"]), WHOLE_PAGE_MAX_PX)
    path = SHOT_DIR / f"{name}-whole-{size['width']}x{size['height']}.png"
    SHOT_DIR.mkdir(parents=True, exist_ok=True)
    if height == size["height"]:  # the page fits the window: no resize, no redraw to await
        page.screenshot(path=str(path))
        return
    page.set_viewport_size({"width": size["width"], "height": height})
    wait_settled(page)  # charts redraw at the new height
    page.screenshot(path=str(path))
    page.set_viewport_size(size)
    if settle:
        wait_settled(page)


TWO_TIMELINES_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p =>
  [...p.querySelectorAll('.ytick text')].some(t => t.textContent === 'compute')).length === 2"""


def compare_sync_and_async(page: sync_api.Page) -> None:
    """Click the A/B page's one-click comparison and wait for its two timelines."""
    page.get_by_role("button", name="Compare sync and async").click()
    page.wait_for_function(TWO_TIMELINES_JS, timeout=120_000)
    page.mouse.move(5, 5)  # the button's tooltip off the shots


def wait_text(page: sync_api.Page, text: str, limit_ms: int = 30_000) -> None:
    """Until the page says ``text`` (or ``limit_ms`` passes: the caller's assert then
    reports it), in place of a fixed wait before reading the page."""
    try:
        page.wait_for_function("t => document.body.innerText.includes(t)", arg=text,
                               timeout=limit_ms)
    except sync_api.TimeoutError:
        pass


def test_ab_view_shows_two_timelines(page: sync_api.Page) -> None:
    goto_page(page, "A/B")
    compare_sync_and_async(page)
    text = body_text(page)
    assert "Decode throughput" in text and "alternated pairs" in text
    wait_settled(page)
    shoot(page, "ab")
    shoot_whole_page(page, "ab")


def test_a_shipped_recording_opens(page: sync_api.Page) -> None:
    goto_page(page, "Recordings")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.js-plotly-plot')].filter(p =>
             [...p.querySelectorAll('.ytick text')].some(t => t.textContent === 'compute'))
             .length === 2""",
        timeout=60_000,
    )
    assert "commit" in body_text(page)
    wait_settled(page)
    shoot(page, "recordings")
    shoot_whole_page(page, "recordings")


def test_a_page_opened_by_its_url_has_the_navigation(server, browser) -> None:
    """A page's URL opened in a new tab runs through app.py's navigation: the top bar with
    every page, and no list of a folder's files in a sidebar. (Streamlit also serves the
    scripts of a top-level pages/ folder as pages of their own: such a tab showed a sidebar
    of file names, and the page without the navigation or its layout.)"""
    tab = new_tab(browser, server[0])
    try:
        tab.goto(server[0].rstrip("/") + "/diff")
        tab.wait_for_function(
            "() => [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === 'Diff')",
            timeout=60_000)
        tab.get_by_role("link", name="Playground").first.wait_for(timeout=30_000)
        assert tab.locator('[data-testid="stSidebarNav"]').count() == 0
    finally:
        tab.close()


def test_the_h200_1b_recording_names_the_async_gain_with_its_interval(
    page: sync_api.Page,
) -> None:
    """The verdict on the shipped 1B recording names async's decode gain and its 95%
    interval, never "no measurable difference" for a large gain."""
    goto_page(page, "Recordings")
    page.get_by_label("Shipped recordings (docs/recordings/)").click()
    page.get_by_role("option", name="h200-llama-1b.jsonl").click()
    page.wait_for_function(
        "() => document.body.innerText.includes('Decode throughput: async+graphs is')",
        timeout=60_000,
    )
    text = body_text(page)
    m = re.search(r"async\+graphs is (\d+\.\d)% faster than sync\+graphs \(95% interval "
                  r"\+(\d+\.\d)% to \+(\d+\.\d)%", text)
    assert m, text[:2000]
    gain, lo, hi = (float(x) for x in m.groups())
    assert 0 < lo < gain < hi
    assert "block bootstrap" in text and "no measurable difference" not in text
    assert "Prefill, left out of the figures above" in text


def test_hovering_the_live_timeline_says_it_holds_for_the_pointer(page: sync_api.Page) -> None:
    """While updates are held for the pointer the title no longer says
    "Live"; it says "Held for the pointer", and "Live" again once the pointer leaves."""
    goto_page(page, "Live")
    steps_on_the_timeline(page)
    frame = timeline_frame(page)
    scroll_top(page)
    box = page.locator(TIMELINE).bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.45)
    frame.wait_for_function(
        "() => (window.gaplessLivePlot.heldTitle || '').startsWith('Held for the pointer')",
        timeout=15_000)
    assert "waiting" in frame.evaluate("document.getElementById('held').innerText")
    page.mouse.move(5, 5)
    frame.wait_for_function("() => window.gaplessLivePlot.heldTitle === null", timeout=5_000)
    assert frame.evaluate(
        "document.getElementById('plot').querySelector('.gtitle').textContent").startswith(
        "Live")


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
    wait_text(page, "total time")
    wait_settled(page)
    text = body_text(page)
    assert "total time" in text and any(w in text for w in (
        "no measurable difference", "not settled", "faster", "slower"))
    shoot(page, "benchmark")
    shoot_whole_page(page, "benchmark")


def test_requests_page_lists_the_requests(page: sync_api.Page) -> None:
    goto_page(page, "Requests")
    page.locator('[data-testid="stDataFrame"]').first.wait_for()  # the requests, then the ledger
    wait_text(page, "time to first token")
    wait_settled(page)
    assert "time to first token" in body_text(page)
    shoot(page, "requests")
    shoot_whole_page(page, "requests")


PAGES = ("Live", "Playground", "Benchmark", "A/B", "Recordings", "Diff", "Requests",
         "Step anatomy")
SIZES = (WIDE, SMALL)


def test_screenshots_of_every_page(page: sync_api.Page) -> None:
    """Every page as a window of each size shows it, for the README (artifacts/ only). One
    pass over the pages, both sizes shot on each (each page opened, and the A/B comparison
    run, once).

    In the module's tab: its A/B page still shows the comparison
    test_ab_view_shows_two_timelines ran there, so the A/B shots need no second one; run
    alone, this test runs it. Each shot waits until the page is drawn and still
    (wait_settled), not a fixed time after a page or a resize."""
    tab = page
    try:
        tab.get_by_role("link", name="Live").first.click()
        # The page's own state first ("mode ..." comes from the engine), not the timeline's
        # iframe: on CI a fresh tab right after the benchmark test can hold both live_plot
        # iframes hidden for a long time.
        tab.wait_for_function("() => document.body.innerText.includes('mode ')",
                              timeout=ENGINE_START_S * 1000)
        steps_on_the_timeline(tab)  # something to look at (a rerun may find it running)
        try:
            tab.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
        except sync_api.Error:
            shoot(tab, "failed-live-timeline-hidden")
            raise AssertionError(
                f"the live timeline stayed hidden; the page said: {body_text(tab)[:2000]}"
            ) from None
        for i, title in enumerate(PAGES):
            if title != "Live":
                goto_page(tab, title)
            if title == "A/B":  # the page with its figures, not only its buttons
                try:  # this tab's earlier comparison, drawn again
                    tab.wait_for_function(TWO_TIMELINES_JS, timeout=5_000)
                except sync_api.TimeoutError:
                    compare_sync_and_async(tab)
            name = title.lower().replace("/", "").replace(" ", "-")
            # Both sizes here, the window's size alternating (wide first, then small first
            # on the next page), so that each page needs one resize between its shots.
            for size in SIZES if i % 2 == 0 else SIZES[::-1]:
                if tab.viewport_size != size:
                    tab.set_viewport_size(size)
                scroll_top(tab)
                wait_settled(tab)  # drawn (at the new width, after a resize) and still
                shoot(tab, f"page-{name}")
                # Next: a resize (waited on) or another page (waited on): no settling here.
                shoot_whole_page(tab, f"page-{name}", settle=False)
            scroll_top(tab)
            if title == "Live":
                # The load was for the Live page's charts; the other pages show no live steps
                # (the A/B comparison starts its own load), and the engine's steps kept one
                # of the 2 cores busy through the rest of this test. Stopped here, on this
                # page, and waited for: a click whose rerun is dropped (a tab closed at once,
                # seen under load) leaves the load running for the next test.
                tab.get_by_role("button", name="Stop load").click()
                tab.get_by_role("button", name="Start load").wait_for()
    finally:
        tab.set_viewport_size(WIDE)  # the module's tab as the fixture made it
