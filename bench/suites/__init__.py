"""One module per benchmark, named for what it measures (`python -m bench list` lists them).

Contract: a suite module defines `DESCRIPTION` (one line), `add_arguments(parser)` and
`run(args, out) -> dict` (writes its files under `out`, returns a JSON-able summary).
`python -m bench NAME` loads `bench.suites.<NAME with - replaced by _>`. This package owns
finding and loading suites; it never runs one.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

from bench.harness import report

# Suites that became a part of another: the old name says where its measurement went.
MERGED = {
    "telemetry": "watch-cost --parts telemetry",
    "truth-cost": "watch-cost --parts sampler",
    "dashboard": "watch-cost --parts dashboard",
    "prefill-cpu": "default-model --parts prefill --model models/gapless-tiny-python",
}


def module_name(suite: str) -> str:
    return "bench.suites." + suite.replace("-", "_")


def names() -> list[str]:
    """Every suite, as typed on the command line (underscores shown as dashes)."""
    here = str(Path(__file__).parent)
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules([here])
                  if not m.name.startswith("_"))


def load(suite: str) -> ModuleType:
    """The suite's module; ValueError naming the known suites when there is none (and the
    suite that took over a merged one's measurement)."""
    if suite in MERGED:
        raise ValueError(f"suite {suite!r} is now `python -m bench {MERGED[suite]}`")
    try:
        mod = importlib.import_module(module_name(suite))
    except ModuleNotFoundError as exc:
        if exc.name != module_name(suite):
            raise
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(names())} "
                         f"(python -m bench list)") from None
    for attr in ("DESCRIPTION", "add_arguments", "run"):
        if not hasattr(mod, attr):
            raise ValueError(f"suite {suite!r} lacks {attr} (see bench/suites/__init__.py)")
    return mod


def parser(suite: str, mod: ModuleType | None = None) -> argparse.ArgumentParser:
    """The suite's argument parser, with the harness's own --out option."""
    mod = mod or load(suite)
    ap = argparse.ArgumentParser(prog=f"python -m bench {suite}", description=mod.DESCRIPTION)
    ap.add_argument("--out", default=None, help=report.out_help(f"{suite}/"))
    mod.add_arguments(ap)
    return ap
