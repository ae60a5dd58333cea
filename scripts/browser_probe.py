"""Probe the dashboard's one-engine-state promises in a real browser, with several tabs open.

Starts `streamlit run app.py` (its own engine on the tiny model unless --model says
otherwise) and Debian's headless Chromium, then counts, with no retry anywhere:

- async: clicks on the Live page's "Async batching" toggle, in turn from each tab, each made
  once the clicking tab shows the toggle of the engine's current settings version. Counted:
  clicks whose mode did not hold (the engine ended on the other mode), clicks that did not
  move the settings version by exactly one, refused changes in the server's log, and
  messages about controls nobody touched ("slot count", "CUDA graphs", "sentinel").
- kills: `kill -9` of the engine with tabs on Benchmark, Requests (and Live with three
  tabs), each opened on Live first. Counted: tabs that never showed the dead-engine message
  (blank or stale), tabs that never showed the running engine after the restart, and the
  browser console's "Bad delta path" errors.
- stale: the engine killed, Restart clicked in the first tab (Live), and, as soon as that tab
  shows the running engine, the Restart button the second tab (Benchmark) still shows.
  Counted: healthy engines restarted by that click (the engine's pid changed again).
- shots: screenshots of the pages at 1600x1000 and 1280x800 (--shots).

    .venv/bin/python scripts/browser_probe.py --tabs 2 --clicks 20 --kills 30 --stale 10 \\
        --shots /work/notes/screens [--hog 2]

It prints one line of counts per probe and exits 1 when any count that must be 0 is not.
It never changes a tracked file (the server's config and log go to a temporary folder).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from engine_procs import engine_pids  # noqa: E402  (tests/engine_procs.py)

import engine.envs as envs  # noqa: E402
from bench.harness import headless_chromium as headless  # noqa: E402

WIDE = {"width": 1600, "height": 1000}
SMALL = {"width": 1280, "height": 800}
DEAD = "The engine is not running"
UNTOUCHED = ("Changing the slot count", "Switching CUDA graphs", "Switching the sentinel")
# Running: the banner's settings line, and no dead or hung message.
RUNNING_JS = """() => { const t = document.body.innerText;
  return /settings v\\d+/.test(t) && !t.includes('not running') && !t.includes('not responding')
    && !t.includes('Starting a new engine'); }"""
DEAD_JS = "() => document.body.innerText.includes('The engine is not running')"
STARTING_JS = "() => document.body.innerText.includes('Starting a new engine')"
ENABLED_RESTARTS_JS = """() => [...document.querySelectorAll('button')]
  .filter(b => b.innerText.trim() === 'Restart the engine' && !b.disabled).length"""
OWN_SETTLED_JS = f"() => !({STARTING_JS})() || ({ENABLED_RESTARTS_JS})() === 0"
RESTART_STATE_JS = """() => { const b = [...document.querySelectorAll('button')]
  .filter(b => b.innerText.trim() === 'Restart the engine');
  return !b.length ? 'gone' : b.some(x => !x.disabled) ? 'enabled' : 'disabled'; }"""
VERSION_RE = re.compile(r"settings v(\d+)")
# The async toggle keyed by settings version v (ui/widgets/controls.py's widget_key; Streamlit gives
# a keyed widget's element the class st-key-<key>, its dots as "-").
TOGGLE_AT_JS = """v => [...document.querySelectorAll('[class*="st-key-ctl-async-"]')]
  .flatMap(e => [...e.classList])
  .find(c => c.startsWith('st-key-ctl-async-') && c.endsWith('-' + v)) || null"""


@dataclass
class Tab:
    name: str
    page: object
    console: list[str] = field(default_factory=list)
    closed_sockets: int = 0

    def text(self) -> str:
        return str(self.page.evaluate("document.body.innerText"))


@contextmanager
def server(model: str, log_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`streamlit run app.py` on a free port with config.yaml's settings and ``model``."""
    tmp = Path(tempfile.mkdtemp(prefix="gapless-probe-"))
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["model"] = str((REPO / model).resolve()) if (REPO / model).exists() else model
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    port = headless.free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1",
                 envs.GAPLESS_CONFIG: str(tmp / "config.yaml")})
        try:
            url = f"http://127.0.0.1:{port}"
            headless.wait_healthy(url, 60, proc)
            yield url, proc
        finally:
            headless.stop_group(proc)
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def hog(n: int) -> Iterator[None]:
    """``n`` busy loops at nice 19 (a loaded machine), stopped afterwards."""
    procs = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while 1: pass"])
             for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def engine_pid(server_pid: int, limit_s: float = 0.0) -> int | None:
    deadline = time.monotonic() + limit_s
    while True:
        pids = engine_pids(server_pid)
        if len(pids) == 1:
            return pids[0]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def open_tab(browser: object, url: str, name: str, viewport: dict[str, int] = WIDE) -> Tab:
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(60_000)
    tab = Tab(name, page)
    page.on("console", lambda m: tab.console.append(m.text) if m.type == "error" else None)

    def on_socket(ws: object) -> None:
        def closed(*_: object) -> None:
            tab.closed_sockets += 1

        ws.on("close", closed)

    page.on("websocket", on_socket)
    page.goto(url)
    page.wait_for_function(RUNNING_JS, timeout=240_000)
    return tab


def goto(tab: Tab, title: str) -> None:
    tab.page.get_by_role("link", name=title).first.click()
    if title == "Live":
        tab.page.locator('iframe[title*="live_plot"]').first.wait_for()
        return
    tab.page.wait_for_function(
        "t => [...document.querySelectorAll('h1')].some(h => h.innerText.trim() === t)",
        arg=title)


def version(tab: Tab) -> int:
    found = VERSION_RE.findall(tab.text())
    return int(found[-1]) if found else -1


def wait(tab: Tab, js: str, limit_s: float, arg: object = None) -> bool:
    try:
        tab.page.wait_for_function(js, arg=arg, timeout=limit_s * 1000, polling=100)
        return True
    except Exception:
        return False


def load_running(tab: Tab) -> None:
    """Start the load generator from a Live tab unless it runs."""
    start = tab.page.get_by_role("button", name="Start load")
    stop = tab.page.get_by_role("button", name="Stop load")
    start.or_(stop).first.wait_for()
    if start.count():
        start.click()
        stop.wait_for()


def log_count(log_path: Path, pattern: str, since: int = 0) -> int:
    text = log_path.read_bytes()[since:].decode(errors="replace")
    return len(re.findall(pattern, text))


# ------------------------------------------------------------------------------ probes
def probe_async(browser: object, url: str, tabs_n: int, clicks: int, log_path: Path) -> dict:
    tabs = [open_tab(browser, url, f"live{i}") for i in range(tabs_n)]
    try:
        log0 = log_path.stat().st_size
        reverted = bad_steps = untouched = not_applied = 0
        for i in range(clicks):
            tab = tabs[i % tabs_n]
            v = version(tab)
            want = "sync" if "mode async" in tab.text() else "async"
            # The click lands on the toggle of the version the tab shows, once it is drawn
            # (a person sees the toggle settle before clicking again).
            cls = None
            if wait(tab, TOGGLE_AT_JS, 30, v):
                cls = tab.page.evaluate(TOGGLE_AT_JS, v)
            if cls is None:
                bad_steps += 1
                continue
            tab.page.locator("." + cls).get_by_text("Async batching").click()
            for t in tabs:
                wait(t, "v => /settings v(\\d+)/.test(document.body.innerText) && "
                     "+document.body.innerText.match(/settings v(\\d+)/)[1] > v", 30, v)
                wait(t, TOGGLE_AT_JS, 30, version(t))
            time.sleep(1.5)  # a late second change (a stale push) would land here
            after = version(tab)
            if after != v + 1:
                bad_steps += 1
            if f"mode {want}" not in tab.text():
                reverted += 1
            for t in tabs:
                shown = t.text()
                untouched += sum(shown.count(u) for u in UNTOUCHED)
                not_applied += shown.count("not applied")
        refused = log_count(log_path, r"refused: made on version", log0)
        return {"tabs": tabs_n, "clicks": clicks, "reverted": reverted,
                "version_not_plus_one": bad_steps, "refused_in_log": refused,
                "untouched_messages": untouched, "not_applied_messages": not_applied}
    finally:
        for t in tabs:
            t.page.close()


KILL_PAGES = ("Benchmark", "Requests", "Live")


def probe_kills(browser: object, url: str, tabs_n: int, kills: int, server_pid: int,
                shots: Path | None) -> dict:
    tabs = [open_tab(browser, url, f"tab{i}") for i in range(tabs_n)]
    try:
        load_running(tabs[0])
        for tab, title in zip(tabs, KILL_PAGES, strict=False):
            tab.name = title
            if title != "Live":
                goto(tab, title)
        blank = stuck = failed_restart = 0
        for k in range(kills):
            pid = engine_pid(server_pid, 60)
            if pid is None:
                failed_restart += 1
                break
            os.kill(pid, signal.SIGKILL)
            for t in tabs:
                if not wait(t, DEAD_JS, 20):
                    blank += 1
                    if shots is not None:
                        t.page.screenshot(path=str(shots / f"probe-blank-{k}-{t.name}.png"))
                    print(f"kill {k}: {t.name} never showed the dead engine: "
                          f"{t.text()[:160]!r}", flush=True)
            restarter = tabs[k % tabs_n]
            button = restarter.page.get_by_role("button", name="Restart the engine")
            try:
                button.click(timeout=20_000)
            except Exception:
                restarter.page.reload()
                restarter.page.get_by_role("button", name="Restart the engine").click()
            for t in tabs:
                if not wait(t, RUNNING_JS, 60):
                    stuck += 1
                    print(f"kill {k}: {t.name} never showed the running engine: "
                          f"{t.text()[:160]!r}", flush=True)
                    t.page.reload()
                    wait(t, RUNNING_JS, 60)
        bad_delta = sum("Bad delta path" in m for t in tabs for m in t.console)
        for t in tabs:
            for m in sorted(set(t.console)):
                print(f"console error in {t.name}: {m[:300]}", flush=True)
        return {"tabs": tabs_n, "kills": kills, "tab_kills": kills * tabs_n,
                "blank_after_kill": blank,
                "not_back_after_restart": stuck, "bad_delta_console_errors": bad_delta,
                "websockets_closed": sum(t.closed_sockets for t in tabs),
                "restart_failed": failed_restart}
    finally:
        for t in tabs:
            t.page.close()


def probe_stale(browser: object, url: str, tabs_n: int, attempts: int, server_pid: int,
                log_path: Path) -> dict:
    tabs = [open_tab(browser, url, f"tab{i}") for i in range(tabs_n)]
    try:
        # A on Live, B on Benchmark (the stale one), a third on Requests.
        for tab, title in zip(tabs, ("Live", "Benchmark", "Requests"), strict=False):
            tab.name = title
            if title != "Live":
                goto(tab, title)
        log0 = log_path.stat().st_size
        restarted_healthy = clicked = disabled = gone = own_seen = own_enabled = 0
        a, b = tabs[0], tabs[1]
        for k in range(attempts):
            pid = engine_pid(server_pid, 60)
            os.kill(pid, signal.SIGKILL)
            for t in tabs:
                t.page.get_by_role("button", name="Restart the engine").wait_for(timeout=20_000)
            a.page.get_by_role("button", name="Restart the engine").click()
            # While its restart runs, the tab that asked shows no Restart it could click again
            # (given a moment for the run's next element after its progress line).
            if wait(a, STARTING_JS, 5):
                own_seen += 1
                wait(a, OWN_SETTLED_JS, 1)
                if a.page.evaluate(STARTING_JS) and a.page.evaluate(ENABLED_RESTARTS_JS):
                    own_enabled += 1
            wait(a, RUNNING_JS, 120)
            new = engine_pid(server_pid, 10)
            # The button as B draws it now, read in one go (B may redraw at any moment).
            state = b.page.evaluate(RESTART_STATE_JS)
            if state == "gone":
                gone += 1
            elif state == "disabled":
                disabled += 1
            else:
                try:
                    b.page.get_by_role("button", name="Restart the engine").first.click(
                        timeout=2_000)
                    clicked += 1
                except Exception:  # B ran again meanwhile: its button went
                    gone += 1
            for t in tabs:
                wait(t, RUNNING_JS, 60)
            time.sleep(2)
            after = engine_pid(server_pid, 10)
            if after != new:
                restarted_healthy += 1
                print(f"attempt {k}: the stale click restarted a healthy engine "
                      f"({new} -> {after})", flush=True)
        refused_logged = log_count(log_path, r"restart asked by tab \w+ refused", log0)
        return {"tabs": tabs_n, "attempts": attempts, "stale_clicks": clicked,
                "button_disabled": disabled, "button_gone": gone,
                "healthy_restarted": restarted_healthy, "refusals_logged": refused_logged,
                "restarts_watched": own_seen, "own_restart_enabled_meanwhile": own_enabled}
    finally:
        for t in tabs:
            t.page.close()


SHOT_PAGES = ("Live", "Benchmark", "Requests", "Playground", "A/B", "Step anatomy")


def settle(page: object) -> None:
    page.wait_for_timeout(2500)


def take_shots(browser: object, url: str, server_pid: int, out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    done = []
    tab = open_tab(browser, url, "shots")
    try:
        load_running(tab)
        for size in (WIDE, SMALL):
            tab.page.set_viewport_size(size)
            for title in SHOT_PAGES:
                goto(tab, title)
                settle(tab.page)
                name = f"{title.lower().replace('/', '').replace(' ', '-')}-" \
                       f"{size['width']}x{size['height']}.png"
                tab.page.screenshot(path=str(out / name))
                done.append(name)
            goto(tab, "Live")
            os.kill(engine_pid(server_pid, 60), signal.SIGKILL)
            wait(tab, DEAD_JS, 20)
            settle(tab.page)
            name = f"dead-{size['width']}x{size['height']}.png"
            tab.page.screenshot(path=str(out / name))
            done.append(name)
            tab.page.get_by_role("button", name="Restart the engine").click()
            wait(tab, RUNNING_JS, 120)
    finally:
        tab.page.close()
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/gapless-tiny-python")
    ap.add_argument("--tabs", type=int, default=2, choices=(2, 3))
    ap.add_argument("--clicks", type=int, default=20)
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--stale", type=int, default=10)
    ap.add_argument("--shots", type=Path, default=None, help="folder for screenshots")
    ap.add_argument("--hog", type=int, default=0, help="busy loops at nice 19 beside it")
    ap.add_argument("--log", type=Path, default=None, help="keep the server's log here")
    ap.add_argument("--only", choices=("async", "kills", "stale", "shots"), action="append")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    log_path = args.log or Path(tempfile.mkdtemp(prefix="gapless-probe-log-")) / "server.log"
    wanted = args.only or ["async", "kills", "stale", "shots"]
    results: dict[str, dict] = {}
    with hog(args.hog), server(args.model, log_path) as (url, proc), sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(headless.CHROMIUM),
            args=[*headless.CHROMIUM_ARGS, *headless.BACKGROUND_TAB_ARGS])
        steps: list[tuple[str, Callable[[], object]]] = [
            ("async", lambda: probe_async(browser, url, args.tabs, args.clicks, log_path)),
            ("kills", lambda: probe_kills(browser, url, args.tabs, args.kills, proc.pid,
                                          args.shots)),
            ("stale", lambda: probe_stale(browser, url, args.tabs, args.stale, proc.pid,
                                          log_path)),
        ]
        for name, run in steps:
            if name in wanted:
                t0 = time.monotonic()
                results[name] = run()
                print(f"{name}: {results[name]} ({time.monotonic() - t0:.0f} s)", flush=True)
        if "shots" in wanted and args.shots is not None:
            print("shots:", take_shots(browser, url, proc.pid, args.shots), flush=True)
        browser.close()
    print(f"server log: {log_path}")
    must_be_zero = [("async", "reverted"), ("async", "version_not_plus_one"),
                    ("async", "untouched_messages"), ("kills", "blank_after_kill"),
                    ("kills", "not_back_after_restart"), ("kills", "bad_delta_console_errors"),
                    ("stale", "healthy_restarted"), ("stale", "own_restart_enabled_meanwhile"),
                    ("async", "not_applied_messages")]
    bad = [f"{p}.{k}={results[p][k]}" for p, k in must_be_zero
           if p in results and results[p].get(k)]
    print("FAILED: " + ", ".join(bad) if bad else "all counts that must be 0 are 0")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
