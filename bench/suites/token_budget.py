"""Was the what-if right? A token budget change made live through the dashboard, with the
prediction taken before it and the measurement after it.

Starts the dashboard (app.py, the engine of config.yaml or --config: on this machine the
default model on its CPU) as a child process, opens the Live page in headless Chromium, starts
the dashboard's load generator from its own widgets (--concurrency streams of --prompt-len
prompt + --max-tokens new tokens), lets it run --before-s seconds under the engine's budget,
reads the what-if table, types --budget into the token budget control, lets --after-s seconds
run, and reads the panel's row for that change: the prediction made from the steps before the
change beside what the steps after it measured (p99 inter-token latency and tokens/s).

    python -m bench token-budget                       # 512 -> 64, about two minutes on a CPU
    python -m bench token-budget --budget 128 --before-s 60 --after-s 60

Needs Debian's chromium and playwright (requirements-dev.txt). Reaches nothing beyond
127.0.0.1; stops the dashboard and its engine on the way out, whatever happened.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import report
from bench.harness.headless_chromium import (
    CHROMIUM,
    CHROMIUM_ARGS,
    free_port,
    stop_group,
    wait_healthy,
)

DESCRIPTION = ("a token budget change made live through the dashboard: the what-if's p99 ITL "
               "and tokens/s predicted before it beside those measured after it")
REPO = Path(__file__).resolve().parents[2]
PANEL = "Token budget: what-if"
CONTROL = "Token budget (max_num_batched_tokens)"

# The rows of a Streamlit table inside the keyed container, as lists of cell texts.
READ_TABLE = """(key) => {
  const box = document.querySelector('.st-key-' + key);
  if (!box) return null;
  const table = box.querySelector('table');
  if (!table) return null;
  return Array.from(table.querySelectorAll('tr')).map(
      tr => Array.from(tr.querySelectorAll('th, td')).map(c => c.innerText.trim()));
}"""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--config", default=str(REPO / "config.yaml"),
                    help="the engine's settings file (default: config.yaml)")
    ap.add_argument("--budget", type=int, default=64, help="the budget to change to")
    ap.add_argument("--concurrency", type=int, default=8, help="load generator streams")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--before-s", type=float, default=45.0,
                    help="seconds of load before the change")
    ap.add_argument("--after-s", type=float, default=45.0,
                    help="seconds of load after the change")


def rows_of(table: list[list[str]] | None) -> list[dict[str, str]]:
    """A table read by READ_TABLE as dicts by header (the index column dropped)."""
    if not table or len(table) < 2:
        return []
    head = table[0]
    out = []
    for row in table[1:]:
        if len(row) == len(head):
            out.append(dict(zip(head, row, strict=True)))
        elif len(row) == len(head) + 1:  # an index cell the header row has none for
            out.append(dict(zip(head, row[1:], strict=True)))
    return [{k: v for k, v in r.items() if k} for r in out]


def set_number(page: Any, label: str, value: int) -> None:
    box = page.get_by_label(label, exact=True)
    box.fill(str(value))
    box.press("Enter")
    time.sleep(1.0)  # the rerun the change starts


def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            page.wait_for_selector('iframe[title*="live_plot"]', timeout=180_000)
            print("Live page up", flush=True)
            page.get_by_text("Load generator", exact=True).click()
            set_number(page, "Concurrent requests", args.concurrency)
            set_number(page, "Prompt tokens", args.prompt_len)
            set_number(page, "Output tokens", args.max_tokens)
            page.get_by_role("button", name="Start load").click()
            page.get_by_role("button", name="Stop load").wait_for(timeout=60_000)
            print(f"load started: {args.concurrency} streams of {args.prompt_len} + "
                  f"{args.max_tokens} tokens", flush=True)
            page.get_by_text(PANEL).click()
            page.get_by_label(CONTROL, exact=True).wait_for(timeout=60_000)
            before = int(page.get_by_label(CONTROL, exact=True).input_value())
            time.sleep(args.before_s)
            what_if = rows_of(page.evaluate(READ_TABLE, "budget-predictions"))
            print(f"what-if at budget {before}: {what_if}", flush=True)
            set_number(page, CONTROL, args.budget)
            deadline = time.monotonic() + args.after_s
            changes: list[dict[str, str]] = []
            while time.monotonic() < deadline:
                time.sleep(2.0)
                changes = rows_of(page.evaluate(READ_TABLE, "budget-trials"))
            after = int(page.get_by_label(CONTROL, exact=True).input_value())
            page.screenshot(path=str(args.out_dir / "token-budget.png"), full_page=True)
            page.get_by_role("button", name="Stop load").click()
            return {"before": before, "after": after, "what_if": what_if, "changes": changes}
        finally:
            browser.close()


def run(args: argparse.Namespace, out: Path) -> dict:
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    args.out_dir = out
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "GAPLESS_CONFIG": str(Path(args.config).resolve())}
    log = open(out / "dashboard.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"),
         "--server.port", str(port), "--server.headless", "true"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, 120.0, server)
        got = drive(url, args)
    finally:
        stop_group(server)
        log.close()
    changed = f"{got['before']} → {got['after']}"
    mine = [r for r in got["changes"] if r.get("change") == changed]
    cols = ("budget (tokens)", "predicted p99 ITL (ms)", "measured p99 ITL (ms)",
            "predicted tokens/s", "measured tokens/s", "steps measured", "note")
    table = report.markdown_table(["change", *cols],
                                  [[changed, *(r.get(c, "") for c in cols)] for r in mine],
                                  align="llrrrrrl")
    what_if = report.markdown_table(
        ["budget (tokens)", "predicted p99 ITL (ms)", "predicted tokens/s", "note"],
        [[r.get("budget (tokens)", ""), r.get("predicted p99 ITL (ms)", ""),
          r.get("predicted tokens/s", ""), r.get("note", "")] for r in got["what_if"]],
        align="lrrl")
    load = (f"load: {args.concurrency} streams of {args.prompt_len} prompt + {args.max_tokens} "
            f"new tokens; {args.before_s:g} s before the change, {args.after_s:g} s after")
    if not mine:
        print(f"the panel showed no row for the change {changed}: {got['changes']}")
    report.emit(out, "token_budget", "A live token budget change: predicted and measured",
                [load, "The what-if before the change:\n\n" + what_if,
                 "Predicted before the change, measured after it:\n\n" + table],
                {**got, "load": load})
    return {"change": changed, "rows": mine, "what_if": got["what_if"]}
