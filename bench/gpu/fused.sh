#!/usr/bin/env bash
# Issue 22, the fused decode GEMMs on one H200 (~4.3 min; each part under timeout), outputs under $OUT:
# 1. python -m bench fused-sweep: every tile configuration of the fused kernel vs cuBLAS + the
#    separate ops, per decode GEMM of SmolLM2-135M / Llama-3.2-1B / Llama-3.1-8B at M 1/16/32,
#    with and without PDL -> $OUT/sweep/fused_table.json (the per-shape table);
# 2. the CUDA tests of the fused GEMMs (bf16 kernels, every sweep config, greedy = generate for
#    fused_layer epilogues/six/auto, PDL on/off, graphs off/on);
# 3. decode-step anatomy (kernels per layer, span vs floor) for fused_layer plain vs auto (the
#    table from 1) vs auto + PDL.
# FINAL=1: no sweep; the CUDA tests (TESTS=0: none), then anatomy with the committed table
# (engine/model/gemm_table.json) for the rows in $ROWS ("mode[+pdl] preset batches;...",
# default: plain vs auto + PDL at each shape).
# Dry run on a CPU: DRY=1 OUT=/tmp/x bash bench/gpu/fused.sh
set -x
OUT=${OUT:?set OUT}
PY=${PY:-python3}
[ "${FINAL:-0}" = 1 ] || export GAPLESS_FUSED_TABLE="$OUT/sweep/fused_table.json"
if [ "${FINAL:-0}" = 1 ]; then
  [ "${DRY:-0}" = 1 ] || [ "${TESTS:-1}" = 0 ] || timeout 90 $PY -m pytest -q tests/model/test_fused_gemm.py \
    tests/model/test_fused_cuda.py -m cuda --junitxml="$OUT/junit.xml" -p no:cacheprovider \
    -o addopts= || true
  IFS=';' read -r -a rows <<< "${ROWS:-plain smollm2-135m 16;auto+pdl smollm2-135m 16;plain llama-1b 32,1;auto+pdl llama-1b 32,1;plain llama-8b 32;auto+pdl llama-8b 32}"
  dev=(--steps 10 --warmup 3)
  [ "${DRY:-0}" = 1 ] && dev=(--device cpu --dtype float32 --steps 2 --warmup 1) && rows=("auto+pdl tiny 2")
elif [ "${DRY:-0}" = 1 ]; then
  timeout 120 $PY -m bench fused-sweep --device cpu --out "$OUT/sweep" || true
  rows=("plain tiny 2" "auto tiny 2" "auto+pdl tiny 2" "six+pdl tiny 2")
  dev=(--device cpu --dtype float32 --steps 2 --warmup 1)
else
  timeout 100 $PY -m bench fused-sweep --budget-s 60 --out "$OUT/sweep" || true
  timeout 90 $PY -m pytest -q tests/model/test_fused_gemm.py tests/model/test_fused_cuda.py \
    -m cuda --junitxml="$OUT/junit.xml" -p no:cacheprovider -o addopts= || true
  rows=("plain smollm2-135m 16" "auto smollm2-135m 16" "auto+pdl smollm2-135m 16"
        "plain llama-1b 32,1" "auto+pdl llama-1b 32,1" "auto+pdl llama-8b 32")
  dev=(--steps 10 --warmup 3)
fi
for row in "${rows[@]}"; do
  set -- $row
  mode=${1%+pdl}; pdl=(); [ "$mode" != "$1" ] && pdl=(--fused-pdl)
  timeout 40 $PY -m bench anatomy --preset "$2" --batches "$3" --impls gapless \
    --fused-layer "$mode" "${pdl[@]}" "${dev[@]}" --out "$OUT/anatomy-$1-$2" || true
done
