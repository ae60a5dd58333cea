"""Pick the shipped model among runs of a sweep, by validation loss alone.

Owns the choice and the note it adds to the winner's TRAINING.md. The held-out split plays
no part in the choice: it stays a clean estimate for the model that is shipped.

Usage: python -m training.select RUN_DIR [RUN_DIR ...] --dest models/gapless-tiny-python
where each RUN_DIR holds model/ and artifacts/record.json from training.train.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def best_val(record: dict[str, object]) -> float:
    return min(loss for _step, loss in record["val_curve"])  # type: ignore[union-attr]


def select_best(runs: list[Path], dest: Path) -> Path:
    """Copy the finished run with the lowest validation loss to dest; return its folder."""
    records = {}
    for run in runs:
        path = run / "artifacts" / "record.json"
        if path.exists():  # a run that crashed wrote none and simply competes no more
            records[run] = json.loads(path.read_text())
    if not records:
        raise SystemExit(f"no finished run among {[str(r) for r in runs]}")
    winner = min(records, key=lambda r: best_val(records[r]))
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(winner / "model", dest)
    rows = "\n".join(
        f"| {rec['settings']['dropout']} | {rec['steps']} | {best_val(rec):.4f} | "
        f"{rec['heldout_nats']:.4f} | {'shipped' if run == winner else ''} |"
        for run, rec in sorted(records.items(), key=lambda kv: kv[1]["settings"]["dropout"])
    )
    note = f"""
## Sweep

`OUT=<dir> bash training/run_on_gpu.sh` trained these runs side by side on the same GPU,
identical but for dropout, and `training/select.py` shipped the one with the lowest validation
loss (its own command is under Run above). Held-out loss is listed for the record only: it was not
used to choose.

| dropout | steps | best validation (nats/token) | held-out (nats/token) | |
| ---: | ---: | ---: | ---: | --- |
{rows}
"""
    with (dest / "TRAINING.md").open("a") as f:
        f.write(note)
    return winner


def main() -> None:
    p = argparse.ArgumentParser(description="ship the sweep run with the lowest validation loss")
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--dest", type=Path, required=True)
    args = p.parse_args()
    print(f"shipped {select_best(args.runs, args.dest)} to {args.dest}")


if __name__ == "__main__":
    main()
