"""Reading torch.profiler chrome traces: device events, steps split at each host-to-device copy,
and per-step kernel counts and times by family, spans and gaps.

A kernel's family is telemetry.kernel_family's, the classifier the dashboard's kernel lane and
Step anatomy page use, so a bench table and the dashboard name a kernel alike. Pure functions
on the trace's event dicts, so they test on a synthetic timeline without a GPU.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from telemetry.kernel_family import family_of
from telemetry.metrics import union_length


def profiler_trace(prof: Any) -> dict[str, Any]:
    """A finished torch.profiler session's chrome trace as a dict (written to a temporary file
    and read back at once: a later session would zero its CUDA times)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as g:
            return json.load(g)


def device_events(trace_path: str | Path) -> list[dict]:
    """Kernel, memcpy and memset events of a chrome trace, sorted by start."""
    data = json.loads(Path(trace_path).read_text())
    events = [e for e in data.get("traceEvents", [])
              if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(events, key=lambda e: e["ts"])


def split_steps(events: list[dict]) -> list[list[dict]]:
    """One list of events per step, a step starting at each host-to-device copy."""
    steps: list[list[dict]] = []
    for e in events:
        if e["cat"] == "gpu_memcpy" and "htod" in e["name"].lower().replace(" ", ""):
            steps.append([])
        if steps:
            steps[-1].append(e)
    return [s for s in steps if any(e["cat"] == "kernel" for e in s)]


def analyse(steps: list[list[dict]]) -> dict:
    """Per step on average: count and time of each family, span (first kernel to last),
    kernel-busy time (union), and the slowest unclassified kernels."""
    n = len(steps)
    fam: dict[str, dict[str, float]] = defaultdict(lambda: {"count": 0, "us": 0.0})
    names: dict[str, float] = defaultdict(float)
    spans, busy = [], []
    for step in steps:
        kernels = [e for e in step if e["cat"] == "kernel"]
        for e in step:
            f = "copies" if e["cat"] != "kernel" else family_of(e["name"])
            fam[f]["count"] += 1
            fam[f]["us"] += e["dur"]
            if f == "other":
                names[e["name"][:90]] += e["dur"]
        start = min(e["ts"] for e in kernels)
        end = max(e["ts"] + e["dur"] for e in kernels)
        spans.append(end - start)
        busy.append(union_length([(e["ts"], e["ts"] + e["dur"]) for e in kernels]))
    per_step = {k: {"count": v["count"] / n, "us": v["us"] / n} for k, v in fam.items()}
    return {"steps": n, "families": per_step, "span_us": sum(spans) / n,
            "kernel_busy_us": sum(busy) / n,
            "other_kernels": sorted(names.items(), key=lambda kv: -kv[1])[:8]}
