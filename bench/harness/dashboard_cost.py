"""Does an open dashboard slow the engine? Engine throughput with and without the Live page
open: the `dashboard` part of `python -m bench watch-cost`.

Runs the Streamlit server of app.py in this process (exactly what `streamlit run app.py`
does: streamlit.web.bootstrap) and, on a second thread, drives the very engine the
dashboard shows, through the same cached client (ui.engine_link). Each phase runs one fixed
workload (EngineClient.run_benchmark: the same seeded prompts, greedy, EOS ignored, in the
engine's current live settings), alternately with no browser attached and with headless
Chromium on the Live page (timeline at 1 Hz, gauges at 2 Hz, its steps on screen). Phases
alternate A B A B ... so drift and other load on the machine hit both. Prints one row per
phase (with the CPU each process used) and the median throughput ratio.

    python -m bench watch-cost --parts dashboard [--repeats 6] [--requests 16] \\
        [--max-tokens 128] [--pin-engine 0]

On a small VM the CPU engine's throughput depends on whether the other vCPUs are idle
(waking an idle vCPU for each hand-off between the engine's threads is slow): any load on
the other cores, the dashboard included, can make it faster. --pin-engine keeps the engine
on its own CPUs and the dashboard on the rest, which removes that effect from the
comparison.

Needs /usr/bin/chromium (Debian's chromium package) and the playwright package.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.headless_chromium import CHROMIUM, CHROMIUM_ARGS, free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]


@dataclass(slots=True)
class Phase:
    label: str
    seconds: float
    tokens: int
    steps: int
    gpu_busy: float
    cpu_s: dict[str, float]  # CPU seconds used during the phase: engine, server, browser

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def cpu_usage(engine_pid: int) -> dict[str, float]:
    """CPU seconds so far of the engine, this process (the Streamlit server, this bench's
    driver and the client's receiver thread) and every other descendant (the browser)."""
    me = os.getpid()
    browser = sum(_proc_cpu_s(p) for p in _descendants(me) if p != engine_pid)
    return {"engine": _proc_cpu_s(engine_pid), "server": _proc_cpu_s(me), "browser": browser}


def parse_cpus(text: str) -> set[int]:
    """ "0" or "0,2-3" -> {0} or {0, 2, 3}."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pin(pid: int, cpus: set[int]) -> None:
    """Move every thread of ``pid`` onto ``cpus`` (threads made later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that just ended
            pass


def measure(client: Any, label: str, spec: Any) -> Phase:
    """Run the fixed workload once; its throughput, busy fraction and the CPU it took."""
    c0 = cpu_usage(client.pid)
    result = None
    for item in client.run_benchmark(spec):
        if hasattr(item, "records"):
            result = item
    c1 = cpu_usage(client.pid)
    assert result is not None, "the benchmark yielded no result"
    return Phase(
        label=label,
        seconds=result.total_s,
        tokens=result.generated_tokens,
        steps=result.num_steps,
        gpu_busy=result.gpu_busy,
        cpu_s={k: c1[k] - c0[k] for k in c0},
    )


def drive(url: str, args: argparse.Namespace, phases: list[Phase]) -> None:
    """The benchmark proper, on its own thread while the server runs on the main one."""
    from playwright.sync_api import sync_playwright

    from engine.drivers.workload import BenchmarkSpec
    from ui.engine_link import _shared_client

    wait_healthy(url, 60.0)
    client = _shared_client()  # the cached client every page of this server uses
    print(f"engine: {client.settings()}", flush=True)
    if args.pin_engine:
        engine_cpus = parse_cpus(args.pin_engine)
        rest = set(range(os.cpu_count() or 1)) - engine_cpus
        if not rest:
            raise SystemExit(f"--pin-engine {args.pin_engine} leaves no CPU for the dashboard")
        pin(client.pid, engine_cpus)
        pin(os.getpid(), rest)  # the server, and the browser it launches, run elsewhere
        print(f"engine pinned to CPUs {sorted(engine_cpus)}, dashboard to {sorted(rest)}")
    # One mode: the engine's own live settings (an empty mode changes nothing).
    spec = BenchmarkSpec(
        num_requests=args.requests,
        prompt_len=args.prompt_len,
        max_tokens=args.max_tokens,
        modes=[{}],
        warmup=False,
    )
    try:
        measure(client, "warm-up", spec)
        with sync_playwright() as p:
            for r in range(args.repeats):
                phases.append(measure(client, f"no browser #{r + 1}", spec))
                print(phases[-1], flush=True)
                browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                            args=list(CHROMIUM_ARGS))
                page = browser.new_page(viewport={"width": 1500, "height": 1300})
                page.goto(url)
                # The Live page's timeline (a live_plot frame, ui/widgets/live_plot.py).
                page.wait_for_selector('iframe[title*="live_plot"]', timeout=120_000)
                time.sleep(2.0)  # the page's first full run and its fragment timers settle
                phases.append(measure(client, f"Live page open #{r + 1}", spec))
                print(phases[-1], flush=True)
                browser.close()
                time.sleep(2.0)  # the session's fragments stop with the socket
    finally:
        client.shutdown()


def print_report(phases: list[Phase], args: argparse.Namespace) -> None:
    print()
    print(
        f"Engine throughput with and without the dashboard: {args.requests} requests x "
        f"({args.prompt_len} prompt + {args.max_tokens} output tokens), greedy, EOS ignored, "
        f"per phase; load average before: {args.load_before}"
        + (f"; engine pinned to CPUs {args.pin_engine}" if args.pin_engine else "")
    )
    print(f"machine: {os.cpu_count()} CPUs; CPU columns are cores used (CPU s / wall s)")
    print(
        f"{'phase':<20} {'seconds':>8} {'tokens':>8} {'steps':>7} {'tok/s':>9} {'busy %':>7}"
        f" {'engine':>7} {'server':>7} {'browser':>8}"
    )
    for ph in phases:
        cores = {k: v / ph.seconds for k, v in ph.cpu_s.items()}
        print(
            f"{ph.label:<20} {ph.seconds:>8.2f} {ph.tokens:>8} {ph.steps:>7} "
            f"{ph.tokens_per_s:>9.1f} {100 * ph.gpu_busy:>7.1f} {cores['engine']:>7.2f} "
            f"{cores['server']:>7.2f} {cores['browser']:>8.2f}"
        )
    base = [p.tokens_per_s for p in phases if p.label.startswith("no browser")]
    live = [p.tokens_per_s for p in phases if p.label.startswith("Live")]
    if base and live:
        ratio = statistics.median(live) / statistics.median(base)
        pairs = [lv / b for b, lv in zip(base, live, strict=False)]
        print(
            f"\nmedian tok/s: no browser {statistics.median(base):.1f}, Live page open "
            f"{statistics.median(live):.1f}: ratio {ratio:.4f} ({100 * (ratio - 1):+.2f}%); "
            f"per pair: {', '.join(f'{100 * (x - 1):+.2f}%' for x in pairs)}"
        )
        if len(pairs) > 1:
            mean = statistics.fmean(pairs)
            sem = statistics.stdev(pairs) / len(pairs) ** 0.5
            print(
                f"mean per-pair change {100 * (mean - 1):+.2f}% +- {100 * sem:.2f}% "
                f"(standard error over {len(pairs)} pairs)"
            )


def add_dashboard_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--repeats", type=int, default=6, help="pairs of phases")
    ap.add_argument("--requests", type=int, default=16, help="requests per workload run")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument(
        "--pin-engine",
        default="",
        metavar="CPUS",
        help="run the engine on these CPUs (e.g. 0) and the dashboard on the others",
    )


def dashboard_cost(args: argparse.Namespace) -> dict:
    """Alternated phases without and with the Live page open (module docstring); the phases'
    figures. Runs the Streamlit server on this process's main thread until they are done."""
    args.load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if not CHROMIUM.exists():
        sys.exit(f"{CHROMIUM} is missing: apt-get install chromium")
    os.chdir(REPO)  # .streamlit/config.toml and config.yaml are read from here
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    phases: list[Phase] = []
    failed: list[BaseException] = []

    def driver() -> None:
        try:
            drive(url, args, phases)
        except BaseException as exc:  # report, then still stop the server
            traceback.print_exc()
            failed.append(exc)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # streamlit's handler stops the server

    from streamlit.web import bootstrap

    flags = {"server.port": port, "server.headless": True}
    bootstrap.load_config_options(flag_options=flags)
    threading.Thread(target=driver, name="bench-driver", daemon=True).start()
    bootstrap.run(str(REPO / "app.py"), False, [], flags)
    print_report(phases, args)
    if failed:
        raise SystemExit(1)
    return {"load_before": args.load_before,
            "phases": [{"label": p.label, "seconds": p.seconds, "tokens": p.tokens,
                        "steps": p.steps, "tok_s": p.tokens_per_s, "gpu_busy": p.gpu_busy,
                        "cpu_s": p.cpu_s} for p in phases]}
