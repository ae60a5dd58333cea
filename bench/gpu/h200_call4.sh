#!/usr/bin/env bash
# Fourth call on the lent H200 (2026-12-02, the ~2 device minutes left): does the start-marker
# kernel in each captured graph (engine/step/graphs.py) put a sync graph step's compute span
# on its kernels? The two CUDA tests of in-graph timing, with each step's figures printed.
set -u
export PYTHONUNBUFFERED=1
timeout 75 python3 -m pytest -q -s -x -p no:cacheprovider -m cuda \
  "tests/engine/test_anatomy_recording.py::test_on_cuda_kernels_join_their_step_and_lie_inside_our_compute_span" \
  tests/telemetry/test_telemetry_ingraph_cuda.py 2>&1 | tee $OUT/call4.log | tail -40
