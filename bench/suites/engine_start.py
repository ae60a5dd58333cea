"""How long an engine process takes to start and restart: spawned fresh, or forked from the
owner's fork server (engine/process/forkserver.py; machines without a GPU).

For each way, in alternated order (--repeats rounds): an EngineClient's start to its Ready
(the first start of a fork-server owner includes starting the fork server), then --restarts
restarts (the dashboard's Restart button: restart() keeps the settings), each timed to Ready;
the engine's own CPU seconds at Ready (utime + stime of its process: a forked engine's count
from its fork) and one greedy completion checked equal across the ways. Each round runs in a
fresh owner process (`python -c`), so a round's first start is a first start.

    python -m bench engine-start                       # ~1 min on a 2-core CPU, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.harness import report
from engine import envs

DESCRIPTION = "how long an engine process takes to start and restart, spawned or forked"
ROOT = Path(__file__).resolve().parents[2]

OWNER = r"""
import json, os, sys, time
from engine import SamplingParams
from engine.process.client import EngineClient

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

args = json.loads(sys.argv[1])
out = {"starts": [], "engine_cpu": [], "kind": None}
t = time.perf_counter()
c = EngineClient(None, model=args["model"], device="cpu", max_num_seqs=4,
                 max_num_batched_tokens=64, max_model_len=256)
out["starts"].append(time.perf_counter() - t)
out["engine_cpu"].append(cpu(c.pid))
out["kind"] = type(c._session.proc).__name__
out["tokens"] = c.generate([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0,
                                                        ignore_eos=True)).token_ids
for _ in range(args["restarts"]):
    t = time.perf_counter()
    c.restart()
    out["starts"].append(time.perf_counter() - t)
    out["engine_cpu"].append(cpu(c.pid))
c.shutdown()
print(json.dumps(out))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="models/gapless-tiny-python")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, ways alternated")
    parser.add_argument("--restarts", type=int, default=3, help="restarts after each start")


def _round(way: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           envs.GAPLESS_ENGINE_FORKSERVER: "1" if way == "forked" else "0"}
    done = subprocess.run([sys.executable, "-c", OWNER, json.dumps(
        {"model": args.model, "restarts": args.restarts})], capture_output=True, text=True,
        env=env, cwd=ROOT, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the {way} round failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace, out: Path) -> dict:
    load_start = os.getloadavg()
    rounds: dict[str, list[dict]] = {"spawned": [], "forked": []}
    for i in range(args.repeats):
        for way in (("spawned", "forked") if i % 2 == 0 else ("forked", "spawned")):
            rounds[way].append(_round(way, args))
    load_end = os.getloadavg()
    rows, stats = [], {}
    for way, rs in rounds.items():
        first = [r["starts"][0] for r in rs]
        again = [s for r in rs for s in r["starts"][1:]]
        cpu = [c for r in rs for c in r["engine_cpu"]]
        stats[way] = {"kind": sorted({r["kind"] for r in rs}), "first_s": first,
                      "restart_s": again, "engine_cpu_s": cpu}
        rows.append([way, "/".join(stats[way]["kind"]), f"{statistics.median(first):.2f}",
                     f"{statistics.median(again):.2f} ({min(again):.2f}-{max(again):.2f})",
                     f"{statistics.median(cpu):.2f}"])
    same = len({json.dumps(r["tokens"]) for rs in rounds.values() for r in rs}) == 1
    table = report.markdown_table(
        ["way", "engine process", "first start s (median)", "restart s, median (range)",
         "engine CPU-s to Ready (median)"], rows)
    facts = (f"EngineClient on {args.model} (cpu), {args.repeats} rounds a way, alternated, "
             f"{args.restarts} restarts a round; greedy tokens equal across ways: {same}; "
             f"load average at start {' '.join(f'{x:.2f}' for x in load_start)}, at end "
             f"{' '.join(f'{x:.2f}' for x in load_end)}")
    data = {"stats": stats, "same_tokens": same, "loadavg_start": load_start,
            "loadavg_end": load_end, "model": args.model, "repeats": args.repeats,
            "restarts": args.restarts}
    report.emit(out, "engine-start", "Engine process start and restart", [facts, table], data)
    return data
