#!/usr/bin/env bash
# Issue 22 on one H200 (~5 min), outputs under $OUT: the CUDA tests of the fused GEMMs (bf16
# kernels, greedy = generate, graphs off/on, both flags), then kernels per layer and the decode
# step span vs the byte floor for the present gapless path, GAPLESS_FUSED_EPILOGUES=1 and
# GAPLESS_FUSED_LAYER=1. Dry run on a CPU: DRY=1 OUT=/tmp/x bash bench/gpu/fused.sh
set -x
OUT=${OUT:?set OUT}
PY=${PY:-python3}
if [ "${DRY:-0}" = 1 ]; then
  specs=("tiny 2"); dev=(--device cpu --dtype float32 --steps 2 --warmup 1)
else
  specs=("smollm2-135m 16" "llama-1b 32,1" "llama-8b 32"); dev=(--steps 10 --warmup 3)
  $PY -m pytest -q tests/model/test_fused_gemm.py tests/model/test_fused_cuda.py -m cuda \
    --junitxml="$OUT/junit.xml" -p no:cacheprovider -o addopts= || true
fi
for mode in base epi six; do
  case $mode in base) E=();; epi) E=(GAPLESS_FUSED_EPILOGUES=1);; six) E=(GAPLESS_FUSED_LAYER=1);; esac
  for spec in "${specs[@]}"; do
    set -- $spec
    env "${E[@]}" timeout 100 $PY -m bench anatomy --preset "$1" --batches "$2" \
      --impls gapless "${dev[@]}" --out "$OUT/anatomy-$mode-$1" || true
  done
done
