#!/usr/bin/env bash
# The shipped model's device run: one GPU, one call.
#
# Trains a dropout sweep side by side on the one GPU (each run is launch-bound, so they share
# it well), ships the run with the lowest validation loss to models/gapless-tiny-python, and
# leaves in $OUT the logs, the artifacts and the model folder as tar parts of at most 15 MB.
# Usage, from the repo root: OUT=/some/dir bash training/run_on_gpu.sh
# CPU rehearsal: OUT=/tmp/o PYTHON=.venv/bin/python TRAIN_ARGS=--smoke DEST=/tmp/m bash ...
set -uo pipefail
: "${OUT:?set OUT to the folder that receives logs and the packed model}"
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
RUNS=/tmp/gapless-runs
DEST=${DEST:-models/gapless-tiny-python}
rm -rf "$RUNS" && mkdir -p "$RUNS"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee "$OUT/run.log"
pids=()
for d in 0.0 0.1 0.2; do
    # shellcheck disable=SC2086  # TRAIN_ARGS is a list of flags
    RAYON_NUM_THREADS=5 OMP_NUM_THREADS=4 $PYTHON -m training.train ${TRAIN_ARGS:-} --dropout "$d" \
        --out "$RUNS/d$d/model" --artifacts "$RUNS/d$d/artifacts" >"$OUT/train_d$d.log" 2>&1 &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid" || echo "run $pid failed with $?" | tee -a "$OUT/run.log"
done
$PYTHON -m training.select "$RUNS"/d* --dest "$DEST" 2>&1 | tee -a "$OUT/run.log" || exit 1
tar cf "$OUT/artifacts.tar" -C "$RUNS" $(cd "$RUNS" && ls -d d*/artifacts)
tar cf - -C "$(dirname "$DEST")" "$(basename "$DEST")" | split -b 15m - "$OUT/model.tar.part"
du -sb "$DEST" "$DEST"/* | tee -a "$OUT/run.log"
