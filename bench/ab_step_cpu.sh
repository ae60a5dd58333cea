#!/bin/bash
# Before/after for bench/bench_step_cpu.py on a noisy machine: two source trees (exports of
# two commits: `git archive C | tar -x -C DIR`, with models/ linked in), the same bench script
# copied into both, run alternately for 3 rounds; then
#   python bench/bench_step_cpu.py --summarize OUT
# prints the median over rounds of each cell, before beside after.
# Usage: bench/ab_step_cpu.sh BEFORE_DIR AFTER_DIR OUT [bench arguments...]
set -u
before=$1; after=$2; out=$3; shift 3
py=${PYTHON:-python}
for round in 1 2 3; do
  for tree in "$before" "$after"; do
    label=$([ "$tree" = "$before" ] && echo before || echo after)
    echo "## round $round tree $label ($tree) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "$tree" && timeout 900 "$py" bench/bench_step_cpu.py "$@" 2>&1 | grep -v "Token indices")
  done
done > "$out"
