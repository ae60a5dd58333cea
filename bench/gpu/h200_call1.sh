#!/usr/bin/env bash
# First of two calls on the lent H200 after the issue 9-15 merges: every CUDA test, the
# telemetry truth run (issue 12) and the dashboard recordings (issue 14). Each part has its
# own time limit; a part that fails does not stop the others. Everything lands in one
# tarball ($OUT/call1.tgz: the device tool returns at most 8 files) plus a summary.
set -u
W=/tmp/gapless-call1; rm -rf $W; mkdir -p $W/rec
export PYTHONUNBUFFERED=1 PY=${PY:-python3}
PART_TAIL=15
source "$(dirname "${BASH_SOURCE[0]}")/part.sh"
$PY -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"
part cuda_tests 210 $PY -m pytest -q -p no:cacheprovider -m cuda tests/engine tests/kernel \
  tests/telemetry tests/model tests/test_smollm2.py -rs
TAIL=40 OUT=$W part telemetry_truth 250 $PY bench/bench_telemetry_truth.py
part rec_8b 60 $PY bench/record_timeline.py --preset llama-8b --machine "NVIDIA H200" \
  --out $W/rec/h200-llama-8b.jsonl
part rec_1b 45 $PY bench/record_timeline.py --preset llama-1b --machine "NVIDIA H200" \
  --out $W/rec/h200-llama-1b.jsonl
tar czf $OUT/call1.tgz -C $W . && ls -la $OUT
