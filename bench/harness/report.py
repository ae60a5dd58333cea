"""Reporting for benchmarks: markdown tables, the results folder
`artifacts/bench/<YYYY-MM-DD>-<machine>-<shortcommit>/<suite>/` (ignored by git; `--out` picks
another), and the JSON + markdown files a suite leaves there with the command, machine, commit
and date that produced them.

Owns names and files; never measures anything, and never writes inside the tracked tree: runs
are records, and the figures worth keeping are copied into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "artifacts" / "bench"


def out_help(tail: str = "") -> str:
    """The help of an `--out` option: the default folder (tail: the part under the run folder)."""
    return f"folder for the files (default: artifacts/bench/<date>-<machine>-<commit>/{tail})"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   align: str | None = None) -> str:
    """A markdown table; `align` is one letter per column, l or r (default: first left, rest
    right). Floats are printed as given: format them before."""
    align = align or "l" + "r" * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def short_commit() -> str:
    """BENCH_COMMIT if set (`ab` names each tree so), else git's short HEAD, else 'nocommit'
    (a copy of the tree without .git)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nocommit"
    return head or "nocommit"


def machine_name() -> str:
    """'nvidia-h200' (or 'nvidia-h200-x2' for several), else 'cpu<cores>'; read through NVML
    or nvidia-smi so the caller's process never opens a CUDA context."""
    names: list[str] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(pynvml.nvmlDeviceGetCount())]
        names = [n.decode() if isinstance(n, bytes) else n for n in names]
    except Exception:  # no NVML: no NVIDIA device, or no nvidia-ml-py
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            names = [n.strip() for n in out.stdout.splitlines() if n.strip()]
        except (OSError, subprocess.SubprocessError):
            names = []
    if not names:
        return f"cpu{os.cpu_count()}"
    base = names[0].lower().replace(" ", "-")
    base = "-".join(p for p in base.split("-") if p and p not in ("nvl", "sxm", "pcie"))
    return base if len(names) == 1 else f"{base}-x{len(names)}"


def run_folder(root: Path | None = None) -> Path:
    """`<root>/<date>-<machine>-<commit>` (root: artifacts/bench/ in the checkout)."""
    root = Path(root or RESULTS)
    return root / f"{time.strftime('%Y-%m-%d')}-{machine_name()}-{short_commit()}"


def meta() -> dict:
    """Who produced a result: command, machine, commit, date, versions."""
    info = {"command": "python -m bench " + shlex.join(sys.argv[1:]),
            "machine": machine_name(), "commit": short_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "python": platform.python_version(),
            "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["device"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return info


def write_json(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    return path


def write_markdown(path: Path, title: str, sections: Sequence[str]) -> Path:
    """A markdown file: `# title`, the meta line, then each section (a table or a paragraph)."""
    m = meta()
    head = (f"# {title}\n\n`{m['command']}` on {m.get('device', m['machine'])}, commit "
            f"{m['commit']}, {m['date']}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "\n" + "\n\n".join(s.rstrip() for s in sections) + "\n")
    return path


def emit(out: Path, name: str, title: str, sections: Sequence[str], data: object) -> None:
    """Print the sections and write `<out>/<name>.md` and `<out>/<name>.json` (data + meta)."""
    for s in sections:
        print(s.rstrip() + "\n", flush=True)
    write_markdown(out / f"{name}.md", title, sections)
    write_json(out / f"{name}.json", {"meta": meta(), "results": data})
