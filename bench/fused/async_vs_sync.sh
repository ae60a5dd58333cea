#!/usr/bin/env bash
# Optional second call on the GPU machine (issue 11's last table): sync vs async (both with
# CUDA graphs, model_impl gapless) at the Qwen3-0.6B, Llama-3.2-1B and Llama-3.1-8B shapes,
# batch 32 and 256, 256 prompt + 256 new tokens. ~5 minutes; logs and JSON in $OUT.
#
#   bash bench/fused/async_vs_sync.sh        # PY=/path/to/python to choose the interpreter
set -u
OUT=${OUT:-artifacts/fused}
PY=${PY:-python}
mkdir -p "$OUT"
export OUT
for preset in qwen3-0.6b llama-1b llama-8b; do
  for batch in 32 256; do
    name="async_vs_sync_${preset}_b${batch}"
    timeout 75 "$PY" bench/bench_async.py --preset "$preset" --requests "$batch" --prompt 256 \
      --new 256 --budget 4096 --modes sync-graphs,async-graphs --model-impls gapless \
      >"$OUT/$name.log" 2>&1
    echo "== $name: rc=$?"
    grep -E "^\| (sync|async)-graphs" "$OUT/$name.log"
    [ -f "$OUT/bench_async.json" ] && mv "$OUT/bench_async.json" "$OUT/$name.json"
  done
done
