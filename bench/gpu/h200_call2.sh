#!/usr/bin/env bash
# Second call on the lent H200: the CUDA tests fixed after call 1 (anatomy grouping, Qwen
# references), the telemetry truth run again, the 8B workload with both model impls, and the
# seed workload 32 x (256 + 8192). One tarball back ($OUT/call2.tgz).
set -u
W=/tmp/gapless-call2; rm -rf $W; mkdir -p $W
export PYTHONUNBUFFERED=1 PY=${PY:-python3} OUT_DIR=$OUT
PART_TAIL=8 PART_OUT=$W PART_RESULTS="bench_async.json bench_transformers_cb.json"
source "$(dirname "${BASH_SOURCE[0]}")/part.sh"
part cuda_recheck 130 $PY -m pytest -q -p no:cacheprovider -m cuda \
  tests/model/test_fused_cuda.py tests/engine/test_anatomy_recording.py \
  tests/telemetry/test_telemetry_ingraph_cuda.py
TAIL=14 part telemetry_truth 90 $PY bench/bench_telemetry_truth.py --modes sync-graphs,async-graphs
part async_8b 100 $PY bench/bench_async.py --preset llama-8b --requests 32 --prompt 256 \
  --new 1024 --modes async-graphs --model-impls gapless,transformers
part seed_8192 160 $PY bench/bench_async.py --preset llama-8b --requests 32 --prompt 256 \
  --new 8192 --modes async-graphs --model-impls gapless
tar czf $OUT_DIR/call2.tgz -C $W . && ls -la $OUT_DIR
