"""The truth suite's report (bench/suites/truth.py): its summary as markdown."""

from __future__ import annotations

import statistics
from typing import Any

from bench.harness.report import markdown_table
from bench.harness.sampler_cost import cost_markdown
from bench.harness.truth_anatomy import anatomy_markdown
from bench.harness.truth_busy import fair_markdown
from bench.harness.truth_kick import attempts_markdown


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def num(x: float | None, fmt: str = ".1f") -> str:
    return "n/a" if x is None else format(x, fmt)


def markdown(s: dict[str, Any]) -> str:
    lines = [f"# Telemetry truth: {s['device']}, torch {s['torch']}", ""]
    if "curve" in s:
        c = s["curve"]
        lines += ["## Achievable read bandwidth vs size (cold L2)", "",
                  "| size | TB/s |", "|---:|---:|"]
        lines += [f"| {b >> 20} MB | {bw / 1e12:.2f} |" for b, bw in c["points"]]
        lines += ["", f"device-to-device copy (peak-copy floor): "
                  f"{c['peak_copy_bw'] / 1e12:.2f} TB/s; {c['method']}; "
                  f"{c['seconds']:.1f} s", ""]
    lines += ["## Kernel busy: torch.profiler vs the sampler (medians over repeats)", "",
              "| shape | mode | torch.profiler | ours (sampled) | diff (pp) | diff, each repeat "
              "(pp) | samples/steps (first) |", "|---|---|---:|---:|---:|---|---:|"]
    for preset, sh in s["shapes"].items():
        for mode, r in sh["modes"].items():
            reps = r.get("repeats") or [{"reference": r["reference"].get("busy"),
                                         "ours": r["ours_busy"], "diff_pp": r.get("diff_pp")}]
            ok = [x for x in reps if x["diff_pp"] is not None]

            def mid(key: str, ok: list = ok) -> float | None:
                return statistics.median(x[key] for x in ok) if ok else None

            lines.append(f"| {preset} b{sh['batch']} | {mode} | {pct(mid('reference'))}"
                         f" | {pct(mid('ours'))} | {num(mid('diff_pp'), '+.2f')} | "
                         + " ".join(num(x["diff_pp"], "+.2f") for x in reps)
                         + f" | {r['samples']}/{r['sampled_steps']} |")
    lines += ["", "## Waterfall (seconds of the sampled window)", "",
              "| shape | mode | wall | floor | above floor | gaps | idle CPU | idle launch | "
              "copies+sync | no work | sum/wall |", "|---|---|" + "---:|" * 9]
    for preset, sh in s["shapes"].items():
        for mode, r in sh["modes"].items():
            w = r.get("waterfall")
            if not w:
                continue
            p = w["parts_s"]
            cells = [num(p[k] * 1e3 if p[k] is not None else None, ".1f") for k in (
                "floor", "kernels_above_floor", "in_step_gaps", "idle_cpu", "idle_launch",
                "copies_sync", "no_work")]
            lines.append(f"| {preset} | {mode} | {w['wall_s'] * 1e3:.1f} ms | "
                         + " | ".join(cells) + f" | {num(w['sum_over_wall'], '.4f')} |")
    lines += ["", *fair_markdown(s["shapes"]), *attempts_markdown(s["shapes"])]
    first = next(iter(s["shapes"].values()), {})
    a = first.get("anatomy")
    if a:
        lines += ["", *anatomy_markdown(a)]
    c = first.get("sampler_cost")
    if c:
        lines += ["", *cost_markdown(c)]
    rows = []
    for preset, sh in s["shapes"].items():
        for mode, r in sh["modes"].items():
            for key, where in (("gpm_bare", "bare (decode, no profiler)"),
                               ("gpm", "sampled")):
                g = r.get(key)
                if g and g["readings"] and g.get("anatomy_bytes_per_s"):
                    gp, ap = g["dram_bw_util_pct"], g["anatomy_pct_of_4p8"]
                    rows.append([preset, mode, where, g["readings"], f"{num(gp)}%",
                                 f"{g['anatomy_bytes_per_s'] / 1e12:.2f}", f"{ap:.1f}%",
                                 f"{gp - ap:+.1f}" if gp is not None else "n/a"])
    if rows:
        lines += ["", "## GPM's DRAM bandwidth against the steps' bytes over the same time", "",
                  "GPM: NVML's DRAM_BW_UTIL, % of the H200's 4.8 TB/s, mean of its 0.1 s "
                  "readings in the window; bytes: each step's weights + KV at its contexts.", "",
                  markdown_table(["shape", "mode", "window", "GPM readings", "GPM",
                                  "steps' bytes / time (TB/s)", "= % of 4.8 TB/s",
                                  "GPM - bytes (pp)"], rows)]
    lines.append(f"\ntotal {s['total_s']:.0f} s")
    return "\n".join(lines) + "\n"
