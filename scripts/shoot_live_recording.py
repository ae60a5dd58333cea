"""Screenshot the Live page drawing a telemetry recording (for the README).

The Live page normally watches a live engine. This serves app.py with the engine client
replaced by the test suite's fake (tests/ui/fake_engine.py) whose telemetry bus holds the
steps of one mode of a recording (telemetry/export.py's JSON lines, kernel samples included,
e.g. the H200 one `python -m bench truth` writes), so the timeline, the kernel lane and the
waterfall show that machine's steps on this one. Needs Debian's chromium and playwright.

    python scripts/shoot_live_recording.py RECORDING.jsonl --mode sync+graphs \\
        --out docs/screenshots/live-kernels-8b-h200.png
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LAUNCHER = '''\
import runpy
import sys

sys.path.insert(0, {repo!r})
import ui.engine_link
from telemetry.bus import TelemetryBus
from tests.ui.fake_engine import FakeEngineClient
from ui.figures.recordings import load_recording

_rec = load_recording({path!r})
_steps = [s for s in _rec.steps if _rec.mode_key(s) == {mode!r}][-{last}:]


def _replay():
    c = FakeEngineClient(graphs_available=True)
    c.bus = TelemetryBus(step_capacity=max(4096, len(_steps) + 16))
    for s in _steps:
        c.bus.publish_step(s)
    c._settings.update(async_batching={mode!r}.startswith("async"),
                       cuda_graphs="graphs" in {mode!r},
                       model=_rec.meta.get("model", "recording") + " (recorded on "
                       + _rec.meta.get("machine", "?") + ", replayed)",
                       dtype=_rec.meta.get("dtype", "bfloat16"))
    c.nvml = lambda: None
    return c


ui.engine_link.make_client = _replay
runpy.run_path({app!r}, run_name="__main__")
'''


def main() -> int:
    from bench.harness import headless_chromium as headless

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording")
    ap.add_argument("--mode", default="sync+graphs", help="sync | async, +graphs or not")
    ap.add_argument("--last", type=int, default=400, help="the newest steps of that mode")
    ap.add_argument("--out", default="docs/screenshots/live-kernels-h200.png")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1500)
    ap.add_argument("--wait-s", type=float, default=20.0)
    args = ap.parse_args()
    launcher = REPO / ".shoot_live_app.py"  # beside app.py: its ui/pages/ paths resolve
    launcher.write_text(LAUNCHER.format(repo=str(REPO), path=str(Path(args.recording).resolve()),
                                        mode=args.mode, last=args.last,
                                        app=str(REPO / "app.py")))
    port = headless.free_port()
    log = open("/tmp/shoot_live.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(launcher),
                             "--server.port", str(port), "--server.headless", "true"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        headless.wait_healthy(url, 90, proc)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=str(headless.CHROMIUM),
                                  args=list(headless.CHROMIUM_ARGS))
            page = b.new_page(viewport={"width": args.width, "height": args.height})
            page.goto(url)
            time.sleep(args.wait_s)
            # The kernel lane and the waterfall are below the first screen: their frames
            # draw once scrolled into view.
            # draw once in view (the default height holds the page to the waterfall).
            for frame in page.locator("iframe").all():
                frame.scroll_into_view_if_needed(timeout=10_000)
            page.locator("iframe").first.scroll_into_view_if_needed(timeout=10_000)
            page.evaluate("document.querySelector('section.main, [data-testid=\"stMain\"]')"
                          "?.scrollTo(0, 0)")
            time.sleep(args.wait_s / 2)
            # not mid-rerun: Streamlit fades the elements of a rerun in progress
            page.wait_for_function("!document.querySelector('[data-stale=\"true\"]')",
                                   timeout=60_000)
            out = REPO / args.out
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), timeout=120_000)
            b.close()
        print(out)
    finally:
        headless.stop_group(proc)
        launcher.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
