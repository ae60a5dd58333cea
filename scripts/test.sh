#!/usr/bin/env bash
# The whole test suite (what CI runs, after `bash scripts/setup.sh --dev`), in two phases:
#   1. every test but the browser ones and the background ones, on 3 pytest-xdist workers;
#   2. the browser tests (tests/browser: one `streamlit run app.py` with its engine process,
#      and headless Chromium) in one process, and beside them, at nice +19, the background
#      tests (marked `background` by tests/conftest.py: the Triton-interpreter child and a few
#      modules that only compute, with no clock in their checks) in another.
# Why: phase 1 is bound by CPU (every core busy), while the browser phase mostly waits on
# the browser and the engine. The background tests fill the idle CPU there; at nice +19 they
# take only what the browser phase leaves. All of phase 1 beside the browser phase is no
# faster: there is not enough idle CPU for it, and its clocked checks (throughput, timeouts)
# fail under that load. The background tests hold no such check.
# In phase 1, tests/conftest.py makes each test module one unit of work for the workers (its
# module-scoped engines and compiled models are built once, not once per worker), tests/serving's
# tests that share one `engine serve` one unit, longest first. Phase 1 and the background
# tests run torch with one CPU thread a process (OMP_NUM_THREADS=1, kept if set): workers that
# each start engine processes with a thread per core slow each other down; with one thread,
# as many workers as cores leave the cores part idle (its tests mostly wait on engine
# processes, servers and timeouts), so it runs 3 workers. The browser phase keeps torch's
# default thread count (see docs/testing.md).
# Each lane's junit XML goes to artifacts/junit/ (ignored by git; the background tests' output
# to artifacts/junit/background.log, printed after the browser phase's); time per folder:
# `.venv/bin/python scripts/test_times.py artifacts/junit/phase1.xml`.
# Extra arguments go to every lane (e.g. `-x`, `--lf`, a path); the exit status is the first
# failing lane's (a lane with no test selected counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: no tests collected in that lane
mkdir -p artifacts/junit
START=$SECONDS

phase1() {
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY -m pytest -q -rsR -n 3 --dist loadgroup \
        --no-loadscope-reorder -m "not browser and not background" \
        --junitxml=artifacts/junit/phase1.xml "$@"
}
# With no arguments it collects tests/ without tests/browser (playwright is not imported).
background() {
    (( $# )) || set -- tests --ignore=tests/browser
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} nice -n 19 $PY -m pytest -q -rsR \
        -m "background and not browser" --junitxml=artifacts/junit/background.xml "$@"
}
# No re-run of a failed browser test: one that passes only when re-run hides a race.
# With no arguments it collects tests/browser alone: collecting the whole suite to select
# the browser tests would import torch, transformers and every test module.
browser() {
    (( $# )) || set -- tests/browser
    $PY -m pytest -q -rs -m browser --junitxml=artifacts/junit/phase2.xml "$@"
}

echo "== phase 1 of 2: all tests but the browser and background ones (3 workers)"
phase1 "$@"
one=$? t1=$((SECONDS - START))
echo "== phase 2 of 2: the browser tests (one process), the background tests beside them" \
     "(one process, nice +19, output at the end)"
background "$@" >artifacts/junit/background.log 2>&1 &
pidb=$!
# Interrupted (Ctrl-C): the background tests stop too.
trap 'kill -INT "$pidb" 2>/dev/null; wait "$pidb"' INT TERM
browser "$@"
two=$? t2=$((SECONDS - START))
wait "$pidb"
three=$? t3=$((SECONDS - START))
echo "== the background tests, their output (done at ${t3} s):"
cat artifacts/junit/background.log
echo "== phase 1: exit $one, done at ${t1} s; browser tests: exit $two, done at ${t2} s;" \
     "background tests: exit $three, done at ${t3} s (seconds from the start); load average" \
     "$(cut -d' ' -f1-3 /proc/loadavg)"
ok "$one" || exit "$one"
ok "$two" || exit "$two"
ok "$three" || exit "$three"
exit 0
