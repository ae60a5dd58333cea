#!/usr/bin/env bash
# The whole test suite, in two phases (what CI runs, after `bash scripts/setup.sh --dev`):
#   1. every test but the browser ones, on 3 pytest-xdist workers;
#   2. the browser tests (tests/browser: one `streamlit run app.py` with its engine process,
#      and headless Chromium), in one process, after phase 1.
# In phase 1, tests/conftest.py makes each test module one unit of work for the workers (its
# module-scoped engines and compiled models are built once, not once per worker) and
# tests/http one unit (one `engine serve`), longest first. Why the browser tests run alone:
# beside phase 1 (tried 2026-12-04, one worker on them, the other on the rest) the load
# average reached 6-12 on the 2 cores, and their waits failed or were re-run (a fresh tab's
# live charts stayed hidden three times in a row); alone, they have the machine.
# Phase 1 runs torch with one CPU thread a process (OMP_NUM_THREADS=1, kept if set; phase 2
# keeps torch's default: with one thread there, the two-tab restart test failed once in one
# run and three times in the next, leaving the engine dead; with the default it passed in
# the runs before). Two workers, each
# starting engine processes, with 2 threads each on 2 cores slowed each other about 2x. With
# one thread, phase 1 on 2 workers left the 2 cores part idle (load average 1.4-2.4: its
# tests mostly wait on engine processes, servers and timeouts), so it runs 3 workers: 310 s
# instead of 369 s (2026-12-04, load average up to 3.9, fresh clone of 2cbf127).
# Each phase's junit XML goes to artifacts/junit/ (ignored by git); time per test folder:
# `.venv/bin/python scripts/test_times.py artifacts/junit/phase1.xml`.
# Extra arguments go to both phases (e.g. `-x`, `--lf`); the exit status is the first
# failing phase's (a phase with no test selected counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: no tests collected in that phase
mkdir -p artifacts/junit
echo "== phase 1 of 2: all tests but the browser ones (3 workers)"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY -m pytest -q -rs -n 3 --dist loadgroup --no-loadscope-reorder -m "not browser" \
    --junitxml=artifacts/junit/phase1.xml "$@"
one=$?
echo "== phase 2 of 2: the browser tests (one process)"
$PY -m pytest -q -rs -m browser --junitxml=artifacts/junit/phase2.xml "$@"
two=$?
echo "== phase 1: exit $one; phase 2: exit $two"
ok "$one" || exit "$one"
ok "$two" || exit "$two"
exit 0
