#!/usr/bin/env bash
# One call on the GPU machine for issue 11 (the fused Llama-family forward): the CUDA tests of
# the fused path, the decode-step anatomy (transformers vs gapless) at the 8B and 1B shapes,
# the skinny-GEMM table, and bench_async for both impls at the 8B, 1B and SmolLM2-135M shapes.
# Each part has its own time limit (sum 525 s < 9 min); a part that fails or times out does
# not stop the others. Logs: $OUT/<part>.log (+ JSON beside them); a summary is printed.
#
#   bash bench/fused/gpu_check.sh            # PY=/path/to/python to choose the interpreter
set -u
OUT=${OUT:-artifacts/fused}
PY=${PY:-python}
mkdir -p "$OUT"
export OUT
START=$(date +%s)

part() {  # part NAME LIMIT_S CMD...
  local name=$1 limit=$2
  shift 2
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 )) s (limit $limit s)"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
  [ -f "$OUT/bench_async.json" ] && mv "$OUT/bench_async.json" "$OUT/$name.json"
  return 0
}

"$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton',
triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

part cuda_tests 150 "$PY" -m pytest -q -m cuda -p no:cacheprovider \
  tests/model tests/engine/test_cuda_engine.py
part anatomy_8b 75 "$PY" bench/bench_anatomy.py --preset llama-8b --batch 32 --context 256
part anatomy_1b 45 "$PY" bench/bench_anatomy.py --preset llama-1b --batch 32 --context 256
TAIL=60 part skinny_gemm 65 "$PY" bench/bench_skinny_gemm.py --quick
part async_8b 100 "$PY" bench/bench_async.py --preset llama-8b --requests 32 --prompt 256 \
  --new 1024 --modes async-graphs --model-impls transformers,gapless
part async_1b 45 "$PY" bench/bench_async.py --preset llama-1b --requests 32 --prompt 256 \
  --new 256 --modes sync-graphs,async-graphs --model-impls transformers,gapless
part async_smollm2 45 "$PY" bench/bench_async.py --preset smollm2-135m --requests 16 \
  --prompt 256 --new 512 --modes sync-graphs,async-graphs --model-impls transformers,gapless
echo "== total $(( $(date +%s) - START )) s"
