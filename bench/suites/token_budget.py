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

``--headless`` runs the same change without the dashboard, where there is no browser or
Streamlit (a GPU machine): an engine in this process (a random-weight ``--preset`` shape, or
the config's model), the load generator, the change through Engine.configure and the panel's
own BudgetWatch (ui/figures/token_budget.py, pure), then the same table, and ``--record``
writes the steps as a recording the Recordings page opens, one window per budget:

    python -m bench token-budget --headless --preset llama-8b --budget-from 2048 --budget 256 \
        --concurrency 16 --prompt-len 512 --max-tokens 256 --before-s 60 --after-s 60 \
        --record docs/recordings/h200-llama-8b-budget.jsonl
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
from bench.harness.shapes import PRESETS
from engine import envs

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
    # Short outputs: prompts keep arriving, so the window before the change holds prefill
    # steps of several sizes (the fit needs them) even when a loaded CPU runs few steps.
    ap.add_argument("--budget", type=int, default=64, help="the budget to change to")
    ap.add_argument("--concurrency", type=int, default=8, help="load generator streams")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--before-s", type=float, default=45.0,
                    help="seconds of load before the change")
    ap.add_argument("--after-s", type=float, default=45.0,
                    help="seconds of load after the change")
    headless = ap.add_argument_group("--headless: no dashboard, an engine in this process")
    headless.add_argument("--headless", action="store_true")
    headless.add_argument("--preset", default=None, choices=sorted(PRESETS),
                          help="a random-weight model of this shape (default: the config's "
                          "model)")
    headless.add_argument("--budget-from", type=int, default=None,
                          help="max_num_batched_tokens the engine starts with (default: the "
                          "config's)")
    headless.add_argument("--record", default=None,
                          help="write the steps and request events here (JSON lines)")


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


def read_changes(page: Any, change: str, after_s: float) -> list[dict[str, str]]:
    """The panel's changes table once ``after_s`` seconds passed and the row of ``change``
    at its new budget has a measurement (waiting up to another ``after_s`` for it). A read
    taken while the front end redraws the table can come back partial: such a read is
    skipped, never kept."""
    start, got = time.monotonic(), []
    while time.monotonic() - start < 2 * after_s:
        time.sleep(2.0)
        rows = rows_of(page.evaluate(READ_TABLE, "budget-trials"))
        mine = [r for r in rows if r.get("change") == change]
        if len(mine) == 2:
            got = rows
            if time.monotonic() - start >= after_s and mine[0].get(
                    "measured p99 ITL (ms)", "—") != "—":
                break
    return got


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
            changes = read_changes(page, f"{before} → {args.budget}", args.after_s)
            after = int(page.get_by_label(CONTROL, exact=True).input_value())
            page.screenshot(path=str(args.out_dir / "token-budget.png"), full_page=True)
            page.get_by_role("button", name="Stop load").click()
            return {"before": before, "after": after, "what_if": what_if, "changes": changes}
        finally:
            browser.close()


def run(args: argparse.Namespace, out: Path) -> dict:
    got = run_headless(args) if args.headless else run_dashboard(args, out)
    return tabulate(args, out, got)


def run_dashboard(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    args.out_dir = out
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, envs.GAPLESS_CONFIG: str(Path(args.config).resolve())}
    log = open(out / "dashboard.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(REPO / "app.py"),
         "--server.port", str(port), "--server.headless", "true"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(url, 120.0, server)
        return drive(url, args)
    finally:
        stop_group(server)
        log.close()


def run_headless(args: argparse.Namespace) -> dict[str, Any]:
    """The change without a dashboard (module docstring): the same watch, the same rows."""
    import torch

    from engine import Engine, EngineConfig
    from engine.drivers.loadgen import LoadGenerator, LoadSpec
    from ui.figures.token_budget import (
        BudgetWatch,
        prediction_rows,
        predictions,
        trial_rows,
        what_if_budgets,
    )

    overrides: dict[str, Any] = {}
    if args.budget_from is not None:
        overrides["max_num_batched_tokens"] = args.budget_from
    model = None
    if args.preset:
        from bench.harness.shapes import build_model

        cfg = EngineConfig.from_yaml(args.config, model=f"random:{args.preset}", **overrides)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = build_model(args.preset, device, torch.bfloat16 if device.type == "cuda"
                            else torch.float32)
    else:
        cfg = EngineConfig.from_yaml(args.config, **overrides)
    eng = Engine(cfg, model=model)
    reader = eng.bus.reader(from_now=True)
    kept_steps: dict[int, Any] = {}
    events: list[Any] = []
    watch = BudgetWatch()

    def observe(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1.0)  # the panel's pace
            for r in reader.steps():
                kept_steps[r.step] = r
            events.extend(reader.events())
            settings = eng.settings()
            watch.observe(settings["max_num_batched_tokens"],
                          [kept_steps[k] for k in sorted(kept_steps)][-4000:])

    spec = LoadSpec(concurrency=args.concurrency, prompt_len=args.prompt_len,
                    max_tokens=args.max_tokens, temperature=0.0)
    load = LoadGenerator(eng, spec)
    if model is not None:  # random weights have no tokenizer: token ids only
        load.params.detokenize = False
    load.start()
    try:
        before = int(eng.settings()["max_num_batched_tokens"])
        observe(args.before_s)
        recs = [kept_steps[k] for k in sorted(kept_steps)]
        preds, reason = predictions(recs, what_if_budgets(
            before, eng.settings()["max_num_batched_tokens_range"]))
        what_if = prediction_rows(preds, before) or [{"note": reason}]
        eng.configure(max_num_batched_tokens=args.budget)
        observe(args.after_s)
    finally:
        load.stop()
        eng.shutdown()
    steps = [kept_steps[k] for k in sorted(kept_steps)]
    if args.record:
        write_recording(Path(args.record), args, steps, events, before)
    return {"before": before, "after": args.budget, "what_if": what_if,
            "changes": trial_rows(watch.trials)}


def write_recording(path: Path, args: argparse.Namespace, steps: list, events: list,
                    before: int) -> None:
    """The run as a recording (bench/suites/record_timeline.py's format): a meta line with
    one window per budget, then every step record and request event."""
    import json
    import platform

    import torch

    from telemetry.export import record_to_dict

    windows = []
    for budget in (before, args.budget):
        mine = [r for r in steps if r.token_budget == budget]
        if mine:
            span_s = ((mine[-1].end_ns or 0) - min(s.start_ns for s in mine[0].spans)) / 1e9
            windows.append({"label": f"budget {budget}", "first_step": mine[0].step,
                            "last_step": mine[-1].step, "wall_s": round(span_s, 4),
                            "steps": len(mine)})
    cuda = torch.cuda.is_available()
    meta = {"type": "meta",
            "machine": torch.cuda.get_device_name() if cuda else
            f"CPU ({platform.processor() or platform.machine()})",
            "date": time.strftime("%Y-%m-%d"), "commit": report.short_commit(),
            "model": f"{args.preset} shape, random weights" if args.preset else args.config,
            "workload": f"load generator: {args.concurrency} streams of {args.prompt_len} "
                        f"prompt + {args.max_tokens} new tokens, greedy; token budget "
                        f"{before} then {args.budget}, changed live",
            "windows": windows, "torch": torch.__version__}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        f.write(json.dumps(meta) + "\n")
        for it in [*steps, *events]:
            f.write(json.dumps(record_to_dict(it), separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


def tabulate(args: argparse.Namespace, out: Path, got: dict[str, Any]) -> dict:
    """Print and write the tables: the what-if before the change, then its prediction beside
    the measurement."""
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
