"""The Diff page in a real browser: the shipped H200 1B recording's sync window against its
async window, two CPU recordings, an H200 run against a CPU run, and two captures of the
live engine; screenshots of the first three at both window sizes.

Screenshots go to artifacts/screenshots/ (ignored by git): ``diff-h200-1b-sync-async-*``,
``diff-cpu-tiny-cpu-tiny2-*`` and ``diff-h200-against-cpu-*``, each with a ``-whole-`` shot
of the scrolled page; the copies in docs/screenshots/ are refreshed by hand from there, so
running the tests never changes a tracked file.
"""

from __future__ import annotations

import re

from dashboard_driver import (  # skips this module where there is no browser
    BROWSER_MARKS,
    SMALL,
    WIDE,
    body_text,
    goto_page,
    scroll_top,
    shoot,
    steps_on_the_timeline,
    sync_api,
    wait_settled,
)
from test_pages_browser import shoot_whole_page

pytestmark = BROWSER_MARKS

NO_SIDEWAYS_SCROLL_JS = """() => { const m = document.querySelector('[data-testid="stMain"]');
  return m.scrollWidth <= m.clientWidth + 1; }"""


# The page says the text and nothing of an earlier run is left on it (Streamlit marks an
# element of the run before as stale until the new run replaces or removes it).
DRAWN_JS = """t => document.body.innerText.includes(t)
                   && !document.querySelector('[data-stale="true"]')"""
LAST = "What each run is"  # the diff's last element: its run has drawn the whole diff


def wait_text(page: sync_api.Page, text: str, limit_ms: int = 60_000) -> None:
    """Until the page says ``text`` with nothing stale beside it: the rerun that a choice
    started has drawn it, and what the page says is that run's."""
    page.wait_for_function(DRAWN_JS, arg=text, timeout=limit_ms)


def wait_diff(page: sync_api.Page, text: str) -> str:
    """Until the diff saying ``text`` is drawn whole; the page's text then."""
    wait_text(page, text)
    wait_text(page, LAST)
    return body_text(page)


def choose(page: sync_api.Page, label: str, option: str, then_says: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label``; wait until the page says
    ``then_says`` (text only the rerun of that choice draws)."""
    page.get_by_label(label).click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_text(page, then_says)


def shoot_both_sizes(page: sync_api.Page, name: str) -> None:
    """The first screen and the whole page at 1600x1000 and 1280x800; at each size the page
    scrolls down only, never sideways."""
    for size in (WIDE, SMALL):
        page.set_viewport_size(size)
        page.get_by_role("heading", name="Diff").click()  # no open list or focus ring
        page.mouse.move(5, 5)
        scroll_top(page)
        wait_settled(page)
        assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), f"the page scrolls sideways at {size}"
        shoot(page, name)
        shoot_whole_page(page, name)
    page.set_viewport_size(WIDE)


def test_the_h200_1b_sync_window_against_its_async_window(page: sync_api.Page) -> None:
    """The page opens on the shipped 1B recording's two windows: mode is the one thing apart,
    async is faster with its interval, and the batch-32 boxes carry their own."""
    goto_page(page, "Diff")
    text = wait_diff(page, "Decode throughput: async+graphs is")
    assert "Differs: mode: sync vs async" in text and "Not comparable" not in text
    m = re.search(r"async\+graphs is (\d+\.\d)% faster than sync\+graphs \(95% interval "
                  r"\+(\d+\.\d)% to \+(\d+\.\d)%", text)
    assert m, text[:2000]
    gain, lo, hi = (float(x) for x in m.groups())
    assert 0 < lo < gain < hi
    page.wait_for_function(
        "() => [...document.querySelectorAll('.xtick text')].some(t =>"
        " t.textContent.startsWith('batch 32') && t.textContent.includes('\u2212'))")
    assert "no kernel samples in either run" in text
    shoot_both_sizes(page, "diff-h200-1b-sync-async")


def test_two_cpu_recordings(page: sync_api.Page) -> None:
    """cpu-tiny against its re-recording at a later commit: same device, model and workload,
    the commits named, the batch of 4 judged with its interval."""
    goto_page(page, "Diff")
    wait_text(page, LAST)
    choose(page, "A: run", "cpu-tiny.jsonl", "cpu-tiny sync")
    choose(page, "A: window", "async", "cpu-tiny async")
    choose(page, "B: run", "cpu-tiny2.jsonl", "cpu-tiny2 sync")
    choose(page, "B: window", "async", "Decode throughput: cpu-tiny2 async is")
    text = wait_diff(page, "Decode throughput: cpu-tiny2 async is")
    assert "Not comparable" not in text
    assert re.search(r"Also differs: commit: \w+ vs \w+", text), text[:2000]
    assert "decode-only" in text and "95% interval" in text
    shoot_both_sizes(page, "diff-cpu-tiny-cpu-tiny2")


def test_an_h200_run_against_a_cpu_run_says_what_is_not_comparable(
        page: sync_api.Page) -> None:
    goto_page(page, "Diff")
    wait_text(page, LAST)
    choose(page, "B: run", "cpu-tiny2.jsonl", "cpu-tiny2")
    choose(page, "A: run", "h200-llama-1b.jsonl", "Not comparable: device: NVIDIA H200 vs CPU")
    text = wait_diff(page, "Not comparable: device: NVIDIA H200 vs CPU")
    assert "model: llama-1b shape, random bfloat16 weights vs tiny shape" in text
    assert "Seen by one run only (A only: decode-only 1, 9, 17, 24, 32" in text
    assert "Where a step's time went" in text  # what can be compared is still drawn
    shoot_both_sizes(page, "diff-h200-against-cpu")


def wait_no_diff(page: sync_api.Page) -> None:
    """Until the page asks for a run and draws no diff: the run that asked has ended (its
    stale elements are gone), so a diff drawn after this is a new one."""
    page.wait_for_function(
        """() => { const t = document.body.innerText;
                   return t.includes('Pick a run on each side')
                          && !t.includes("Where a step's time went"); }""", timeout=60_000)


LIVE_PAIR = (r"Decode throughput[^\n]*live (sync|async) \d\d:\d\d:\d\d[^\n]*"
             r"live (sync|async) \d\d:\d\d:\d\d")


def test_two_captures_of_the_live_engine(page: sync_api.Page) -> None:
    """A and B from the live engine under load: each side's Capture button records the next
    seconds of steps, and the two windows are diffed like recordings; against a recording
    of another model the diff says so."""
    goto_page(page, "Live")
    steps_on_the_timeline(page)
    goto_page(page, "Diff")
    wait_text(page, LAST)
    choose(page, "B: run", "cpu-tiny2.jsonl", "cpu-tiny2")
    choose(page, "A: run", "live engine (capture)", "Capture A")
    wait_no_diff(page)
    page.get_by_role("button", name="Capture A").click()
    text = wait_diff(page, "Where a step's time went")
    assert "Not comparable: model:" in text  # the shipped model vs a random one
    choose(page, "B: run", "live engine (capture)", "Capture B")
    wait_no_diff(page)
    page.get_by_role("button", name="Capture B").click()
    page.wait_for_function("re => new RegExp(re).test(document.body.innerText)",
                           arg=LIVE_PAIR, timeout=60_000)
    text = wait_diff(page, "Where a step's time went")
    assert "Not comparable" not in text and "Where a step's time went" in text
