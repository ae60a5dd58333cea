"""The engine's state as every tab sees it, in a real browser: a second tab shows a mode
change made in the first within 2 s; clicks on the async toggle from two tabs in turn each
move the engine once; a SIGSTOPped engine is reported within 3 s on every tab, and
kill-and-restart recovers with the settings kept; after a kill -9 every tab (Live,
Benchmark, Requests) shows the dead engine and then the restarted one; and a Restart button
left over in another tab never restarts the engine a first tab restarted.

None of these is re-run on failure: each clicks a tab only once that tab shows the state the
click is meant for (its own redraw), so a failure is a race in the dashboard, not in the test.
"""

from __future__ import annotations

import os
import signal
import time

from dashboard_driver import (  # skips this module where there is no browser
    BROWSER_MARKS,
    ENGINE_START_S,
    SHOT_DIR,
    TIMELINE,
    body_text,
    engine_pid,
    goto_page,
    new_tab,
    steps_on_the_timeline,
    sync_api,
)

pytestmark = BROWSER_MARKS


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
        # Back, on the toggle of the version the tab shows: a click on an older one is
        # refused by design (see the 20-click test below).
        current_async_toggle(page).click()  # back
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


def _settings_version(tab) -> int:
    import re

    found = re.findall(r"settings v(\d+)", body_text(tab))
    assert found, "no settings version on the page"
    return int(found[-1])


# The async toggle of settings version v is on the page (Streamlit gives a keyed widget's
# element the class st-key-<key>, its non-alphanumerics as "-").
TOGGLE_AT_VERSION_JS = """v => [...document.querySelectorAll('[class*="st-key-ctl-async-"]')]
  .some(e => [...e.classList].some(c => c.startsWith('st-key-ctl-async-')
                                       && c.endsWith('-' + v)))"""
TOGGLE_CLASS_JS = """v => [...document.querySelectorAll('[class*="st-key-ctl-async-"]')]
  .flatMap(e => [...e.classList])
  .find(c => c.startsWith('st-key-ctl-async-') && c.endsWith('-' + v))"""


def current_async_toggle(tab):
    """The async toggle of the settings version the tab shows, once it is drawn: while the
    toggles' row redraws, the previous version's toggle can still be the first "Async
    batching" on the page, and a click on it is refused by design (compare-and-set)."""
    version = _settings_version(tab)
    tab.wait_for_function(TOGGLE_AT_VERSION_JS, arg=version, timeout=30_000)
    return tab.locator("." + tab.evaluate(TOGGLE_CLASS_JS, version)).get_by_text(
        "Async batching")


def test_two_tabs_toggling_async_in_turn_never_flip_the_engine(server, browser, page) -> None:
    """20 clicks on the async toggle, alternating between two Live tabs, each made once the
    clicking tab shows the engine's state: the engine ends every time on the last click, its
    settings version moves by exactly one per click (a flip back and forth by a stale tab
    would move it by more), and no tab speaks of a change not applied or of a control nobody
    touched."""
    other = new_tab(browser, server[0])
    try:
        other.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
        page.wait_for_function("() => document.body.innerText.includes('settings v')")
        start = _settings_version(page)
        tabs = (page, other)
        for i in range(20):
            tab = tabs[i % 2]
            want = "sync" if "mode async" in body_text(tab) else "async"
            current_async_toggle(tab).click()
            for t in tabs:  # both show the engine's new state, at the next version
                t.wait_for_function(
                    "([m, v]) => document.body.innerText.includes(m) && "
                    "document.body.innerText.includes('settings v' + v)",
                    arg=[f"mode {want}", start + i + 1], timeout=30_000)
            # The banner shows the new version first; the toggles' own row redraws on its
            # next second. A click before that lands on the previous version's toggle and is
            # refused by design (compare-and-set); a person sees the toggle move first. So
            # both tabs must hold the new version's toggle (keyed by it: ui/widgets/controls.py's
            # widget_key, class st-key-ctl-async-<pid>-<redraws>-<version>) before the next
            # click; waited for, not slept on.
            for t in tabs:
                t.wait_for_function(TOGGLE_AT_VERSION_JS, arg=start + i + 1, timeout=30_000)
                said = body_text(t)
                assert "not applied" not in said and "slot count" not in said, said[:600]
        time.sleep(3)  # a late stale push would show here
        for t in tabs:
            assert _settings_version(t) == start + 20, body_text(t)[:400]
            assert f"mode {want}" in body_text(t)
    finally:
        other.close()


def _engine_running(server, page) -> None:
    """Start the engine from the page if none runs under the server (an earlier failed test
    can leave the engine it killed dead, and every later test would wait for charts that an
    engine-less page never draws)."""
    try:
        engine_pid(server[1])
        return
    except AssertionError:
        pass
    page.reload()
    page.get_by_role("button", name="Restart the engine").first.click(timeout=30_000)
    page.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)


def _shoot(tabs: dict, name: str) -> str:
    """Screenshots of the tabs into the suite's screenshot folder, and their text, for a
    failure's report."""
    SHOT_DIR.mkdir(parents=True, exist_ok=True)
    said = []
    for label, tab in tabs.items():
        try:
            tab.screenshot(path=str(SHOT_DIR / f"failed-{name}-{label}.png"), full_page=True)
            said.append(f"[{label}] {body_text(tab)[:700]}")
        except Exception as exc:  # the report must not hide the failure
            said.append(f"[{label}] no screenshot: {exc}")
    return "\n".join(said)


RUNNING_JS = """() => { const t = document.body.innerText;
  return /settings v\\d+/.test(t) && !t.includes('not running')
    && !t.includes('Starting a new engine'); }"""
DEAD_JS = "() => document.body.innerText.includes('The engine is not running')"


def test_a_restart_in_one_tab_is_seen_in_the_other_and_its_stale_button_does_nothing(
        server, browser, page) -> None:
    _engine_running(server, page)
    other = new_tab(browser, server[0])
    try:
        other.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
        goto_page(other, "Benchmark")
        _restart_seen_in_both(server, page, other)
    except Exception as exc:
        raise AssertionError(f"{exc}\n{_shoot({'first': page, 'other': other}, 'restart')}"
                             ) from exc
    finally:
        other.close()
    page.locator(TIMELINE).wait_for()


def _restart_seen_in_both(server, page, other) -> None:
    """Kill the engine; restart it from the first tab (Live), and while that restart runs
    click the Restart button the other tab (Benchmark) shows: it restarts nothing (its view
    is of a dead engine that is being restarted), says so, and the other tab follows the
    restart within 2 s."""
    pid = engine_pid(server[1])
    os.kill(pid, signal.SIGKILL)
    for t in (page, other):
        t.get_by_role("button", name="Restart the engine").wait_for(timeout=15_000)
    for t in (page, other):  # watch when each tab shows the running engine again
        t.evaluate(
            """() => { window.__up = null; const o = new MutationObserver(() => {
                  const t = document.body.innerText;
                  if (window.__up === null && /settings v\\d+/.test(t)
                      && !t.includes('not running'))
                    window.__up = Date.now(); });
                  o.observe(document.body, {subtree: true, childList: true,
                                            characterData: true}); }""")
    stale = other.get_by_role("button", name="Restart the engine")
    page.get_by_role("button", name="Restart the engine").click()
    # The first tab's restart is under way (its progress is up) before the other's click.
    page.wait_for_function(
        "() => ['Starting a new engine', 'The engine is running again']"
        ".some(t => document.body.innerText.includes(t))", timeout=30_000)
    # The other tab's button as it is drawn now: enabled (drawn before the restart began) or
    # disabled (its page ran again meanwhile, and says which tab is restarting the engine).
    clicked = False
    if stale.is_enabled():
        try:
            stale.click(timeout=5_000)
            clicked = True
        except sync_api.TimeoutError:  # its page ran again first: disabled, then gone
            pass
    if clicked:
        other.wait_for_function(
            "() => document.body.innerText.includes('Nothing done: the engine is running')",
            timeout=ENGINE_START_S * 1000)
        print("the other tab's stale Restart was clicked and refused")
    else:
        print("the other tab's Restart was drawn disabled during the restart")
    for t in (page, other):
        t.wait_for_function("() => window.__up !== null", timeout=ENGINE_START_S * 1000)
    new_pid = engine_pid(server[1])
    lag = (other.evaluate("window.__up") - page.evaluate("window.__up")) / 1000
    print(f"the other tab showed the restarted engine {lag:.2f} s after the first")
    time.sleep(3)
    assert engine_pid(server[1]) == new_pid != pid, "the stale button restarted it again"
    assert lag <= 2.0, f"the other tab followed the restart {lag:.2f} s late"


def test_every_tab_shows_a_killed_engine_and_then_the_restarted_one(
        server, browser, page) -> None:
    """Tabs on Live, Benchmark and Requests, the load running, the engine killed five times:
    each time every tab says the engine is not running, and shows it running again after a
    restart from one of them. A tab that went blank (its page replaced while a fragment of
    the old one still ran: "Bad delta path index" in its console) fails it."""
    _engine_running(server, page)
    tabs = {"live": page}
    errors: list[str] = []
    try:
        for name in ("benchmark", "requests"):
            tab = new_tab(browser, server[0])
            tab.locator(TIMELINE).wait_for(timeout=ENGINE_START_S * 1000)
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tabs[name] = tab
        steps_on_the_timeline(page)
        goto_page(tabs["benchmark"], "Benchmark")
        goto_page(tabs["requests"], "Requests")
        for k in range(5):
            os.kill(engine_pid(server[1]), signal.SIGKILL)
            for name, tab in tabs.items():
                try:
                    tab.wait_for_function(DEAD_JS, timeout=20_000)
                except sync_api.TimeoutError:
                    raise AssertionError(f"kill {k}: the {name} tab never showed the dead "
                                         f"engine: {body_text(tab)[:300]!r}") from None
            restarter = list(tabs.values())[k % len(tabs)]
            restarter.get_by_role("button", name="Restart the engine").click()
            for name, tab in tabs.items():
                try:
                    tab.wait_for_function(RUNNING_JS, timeout=ENGINE_START_S * 1000)
                except sync_api.TimeoutError:
                    raise AssertionError(f"kill {k}: the {name} tab never showed the "
                                         f"restarted engine: {body_text(tab)[:300]!r}"
                                         ) from None
        assert not [e for e in errors if "Bad delta path" in e], errors
    except Exception as exc:
        raise AssertionError(f"{exc}\n{_shoot(tabs, 'kills')}") from exc
    finally:
        for name, tab in tabs.items():
            if name != "live":
                tab.close()
    page.get_by_role("button", name="Stop load").click()
    page.get_by_role("button", name="Start load").wait_for()
