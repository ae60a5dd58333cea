#!/usr/bin/env bash
# Issue 22, the persistent decode layer (fused_layer: persistent) on one H200: the runs still
# owed when the 2026-12-04 session's device time ran out (docs/benchmarks.md, "A persistent
# decode layer"). Outputs under $OUT; each part under timeout; pytest output straight to files.
#   OUT=/path bash bench/gpu/persistent.sh        # both parts, ~260 s
#   PARTS=4 OUT=/path bash bench/gpu/persistent.sh
# Part 4 (~150 s): the 5 CUDA tests (the one-launch layer at SmolLM2 b16 and 1B b1 bit-equal to
#   one launch a phase; greedy within bf16 ties, graphs off/on, the whole-model launch) and the
#   fenced layer's decode-step anatomy at SmolLM2 b16 and Llama-3.2-1B b1. Predicted (13:58
#   UTC): 5 passed; 1,000-1,100 us and 1,450-1,600 us (slower than five/auto + PDL: 957, 1,173).
# Part 5 (~110 s): persistent-check with the cheaper fence, persistent-clock per variant and
#   shape (per-phase spans, barrier releases, the gap between layers; two programs an SM at 1B).
OUT=${OUT:?set OUT}
PARTS=${PARTS:-4 5}
for part in $PARTS; do
  P=$OUT/part$part
  if [ "$part" = 4 ]; then
    mkdir -p $P; export PYTHONUNBUFFERED=1; T(){ n=$1; shift; s=$(date +%s); timeout "$@" >$P/$n.log 2>&1; echo "$n rc=$? $(($(date +%s)-s))s" >> $P/times.log; }; A="python3 -m bench anatomy --impls gapless --fused-layer persistent --steps 10 --warmup 3"; T tests 95 python3 -m pytest -q -s -rf -p no:cacheprovider -o addopts= -m cuda tests/model/test_persistent_layer.py tests/model/test_persistent_engine.py --junitxml=$P/junit.xml; T anat_s 40 $A --preset smollm2-135m --batches 16 --out $P/anat_s; T anat_1 40 $A --preset llama-1b --batches 1 --out $P/anat_1; cat $P/times.log
  else
    mkdir -p $P; export PYTHONUNBUFFERED=1; T(){ n=$1; shift; s=$(date +%s); timeout "$@" >$P/$n.log 2>&1; echo "$n rc=$? $(($(date +%s)-s))s" >> $P/times.log; }; T check 40 python3 -m bench persistent-check --shapes smollm2-135m --out $P/check; T clock_s 35 python3 -m bench persistent-clock --preset smollm2-135m --batch 16 --out $P/clock_s; T clock_1 35 python3 -m bench persistent-clock --preset llama-1b --batch 1 --out $P/clock_1; T clock_1b 30 python3 -m bench persistent-clock --preset llama-1b --batch 1 --per-sm 2 --out $P/clock_1b; cat $P/times.log
  fi
done
