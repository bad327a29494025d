#!/usr/bin/env bash
# Every GPU measurement of the open issues in one device call (device time is scarce):
# the fusion suite forward and forward+backward with both GPU backends, norm backwards over run
# counts (bench/chunk_sweep.py), the GIoU study, the ragged
# suite, and compiled reductions on two streams at once (tests/test_gpu_streams.py). Each part has its own time limit and writes its output under $OUT as soon as it ends, so
# a part that runs long costs only itself.
set -uo pipefail
OUT=${OUT:-/tmp/ember-gpu}
mkdir -p "$OUT"
export EMBER_CACHE_DIR="$OUT/cache-ignored"   # cold: compile times are part of the record
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
part() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/parts.txt"
}
part fusion 280 python bench/gpu_fusion.py --backends triton,cuda --train
part chunks 150 python bench/chunk_sweep.py
part giou 150 python -m ember.cli bench giou --device cuda --json "$OUT/giou.json"
part ragged_suite 120 python bench/ragged_suite.py --device cuda --json "$OUT/ragged_suite.json"
part streams 60 env PYTHONPATH=. python tests/test_gpu_streams.py
rm -rf "$OUT/cache-ignored"
