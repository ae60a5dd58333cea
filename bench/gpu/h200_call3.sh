#!/usr/bin/env bash
# Third call on the lent H200: transformers' own generate_batch on the 8B workload, and async
# vs sync (gapless, graphs) at the 0.6B, 1B and 8B shapes, batch 32 and 256.
set -u
W=/tmp/gapless-call3; rm -rf $W; mkdir -p $W
export PYTHONUNBUFFERED=1 PY=${PY:-python3} OUT_DIR=$OUT
PART_TAIL=6 PART_OUT=$W PART_RESULTS="bench_async.json bench_transformers_cb.json"
source "$(dirname "${BASH_SOURCE[0]}")/part.sh"
for preset in qwen3-0.6b llama-1b llama-8b; do
  for batch in 32 256; do
    limit=30; [ "$preset" = llama-8b ] && limit=45
    part "avs_${preset}_b${batch}" $limit $PY bench/bench_async.py --preset $preset \
      --requests $batch --prompt 256 --new 128 --budget 4096 \
      --modes sync-graphs,async-graphs --model-impls gapless
  done
done
part transformers_cb_8b 110 $PY bench/bench_transformers_cb.py --preset llama-8b \
  --requests 32 --prompt 256 --new 1024 --modes async
tar czf $OUT_DIR/call3.tgz -C $W . && ls -la $OUT_DIR
