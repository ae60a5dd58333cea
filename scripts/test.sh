#!/usr/bin/env bash
# The whole test suite, in two phases (what CI runs, after `bash scripts/setup.sh --dev`):
#   1. every test but the browser ones, on 2 pytest-xdist workers;
#   2. the browser tests (tests/browser: one `streamlit run app.py` with its engine process,
#      and headless Chromium), in one process, after phase 1.
# Why two phases: pytest 9 no longer reads the group xdist 3.8 writes into a test's node id,
# so `--dist loadgroup` spread the browser tests over both workers; each worker then started
# its own Streamlit server, engine and Chromium on the 2-core VM (load average 18), and the
# waits for the live charts timed out (CI of 2026-12-04). Run alone, they have the machine.
# Extra arguments go to both phases (e.g. `-x`, `--lf`); the exit status is the first
# failing phase's (a phase with no test selected counts as passed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ok() { [ "$1" = 0 ] || [ "$1" = 5 ]; }  # 5: no tests collected in that phase
echo "== phase 1 of 2: all tests but the browser ones (2 workers)"
$PY -m pytest -q -rs -n 2 --dist loadgroup --no-loadscope-reorder -m "not browser" "$@"
one=$?
echo "== phase 2 of 2: the browser tests (one process)"
$PY -m pytest -q -rs -m browser "$@"
two=$?
echo "== phase 1: exit $one; phase 2: exit $two"
ok "$one" || exit "$one"
ok "$two" || exit "$two"
exit 0
