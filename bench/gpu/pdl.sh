#!/usr/bin/env bash
# Issue 22 on one H200: the runs owed since the 2026-12-04 19:16 session (docs/benchmarks.md,
# "PDL launches that overlap"); no device was lent on 2026-12-04 from 22:04 UTC. Outputs under
# $OUT; each step under its own timeout, pytest output straight to files; ~420 s in all.
#   OUT=/path bash bench/gpu/pdl.sh
# 1. tests (~120 s): the PDL and fused CUDA tests at this commit (pdl_available is now the one
#    check of PDL for the attention and the fused kernels); predicted: all pass.
# 2. floor (~20 s): engine.instruments.floor_probe.measure_curve as the engine runs it (in a CUDA graph,
#    back to back over cold buffers), against the shipped telemetry/curves/nvidia-h200.json
#    (which came from the same method in a script). Predicted: within 5% at 1 MB, 32 MB, 1 GB.
# 3. anatomy (~90 s): decode-step span at this commit (code moved after the last figures:
#    6f76f68, cb24444). Predicted: SmolLM2 b16 five + PDL prefetch 763 us +-1%; 1B b1 auto +
#    PDL prefetch 1,138 us +-1%; 8B b32 plain 4,931 us +-1%.
# 4. whole (~190 s): 1B 32 x (256+256) auto with and without PDL prefetch, three times each
#    (the one unexplained 1.25 s run of 2026-12-04).
OUT=${OUT:?set OUT}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
T() { n=$1; shift; s=$(date +%s); timeout "$@" >"$OUT/$n.log" 2>&1; echo "$n rc=$? $(($(date +%s)-s))s" >>"$OUT/times.log"; }
T tests 150 python3 -m pytest -q -rf -p no:cacheprovider -o addopts= -m cuda \
    tests/model/test_pdl_overlap.py tests/model/test_fused_cuda.py tests/model/test_fused_rope.py \
    tests/kernel/test_paged_attention.py --junitxml="$OUT/junit.xml"
T floor 40 python3 -c "
import json; from engine.instruments.floor_probe import measure_curve
c = measure_curve('cuda'); print(c)
s = json.load(open('telemetry/curves/nvidia-h200.json')); print(s)"
A="python3 -m bench anatomy --impls gapless --steps 10 --warmup 3"
T anat_s 40 $A --preset smollm2-135m --batches 16 --fused-layer five --fused-pdl --pdl-overlap prefetch --out "$OUT/anat_s"
T anat_1 40 $A --preset llama-1b --batches 1 --fused-layer auto --fused-pdl --pdl-overlap prefetch --out "$OUT/anat_1"
T anat_8 60 $A --preset llama-8b --batches 32 --fused-layer plain --out "$OUT/anat_8"
W="python3 -m bench async-vs-sync --preset llama-1b --modes async-graphs --repeats 3 --prompt 256 --new 256 --baseline none"
T whole_1 100 $W --fused-layer auto --out "$OUT/whole_1"
T whole_1p 100 $W --fused-layer auto --fused-pdl --pdl-overlap prefetch --out "$OUT/whole_1p"
cat "$OUT/times.log"
