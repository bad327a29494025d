#!/usr/bin/env bash
# One device call for the optimizer steps on the GPU: the foreach tests on the device, the CUDA
# C++ combo kernels' unroll compared on a small GPT's Adam step, the GPT-2-size step, and both
# steps' kernels under Nsight Compute.
# Each part's output goes to $OUT/<part>.txt; PARTS=a,b runs only those. Tests need expecttest
# (carry .whl/, see below).
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     PYTHONPATH=/tmp/site:. bash bench/gpu_optimizer_session.sh
set -uo pipefail
source "$(dirname "$0")/session_parts.sh"  # $OUT, a fresh kernel cache, the GPU; part NAME SECONDS COMMAND...
part foreach_tests 120 env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:logging tests/test_cuda_foreach.py
# (compiling an Adam step over 52-148 parameters takes Dynamo, Inductor and ember 20-60 s each)
part adam_small ${SMALL_LIMIT:-300} python bench/optimizer_step.py --device cuda --optimizer adam --gpt 256,4,8192 --profile \
  --variants ${SMALL_VARIANTS:-inductor,ember,ember-cuda-u4,ember-cuda-u2,ember-cuda-u1}
part adam_gpt2 ${GPT2_LIMIT:-300} python bench/optimizer_step.py --device cuda --optimizer adam --gpt 768,12,50257 --profile \
  --variants ${GPT2_VARIANTS:-eager,inductor,ember,ember-cuda}
# The CUDA C++ backend's tests on the device, with the Adam steps run by it
part cuda_backend_tests 200 env EMBER_TEST_DEVICE=cuda EMBER_GPU_BACKEND=cuda python -m pytest -q -p no:logging \
  tests/test_optimizers.py tests/test_inplace.py
# A/B of both steps against an older tree, ember-cuda: AB_TREE holds its `ember` and `bench`
# (bench/ab_trees.sh); skipped without one
if [[ -n "${AB_TREE:-}" ]]; then
  for gpt in 256,4,8192 768,12,50257; do
    part "ab_${gpt//,/_}" ${AB_LIMIT:-300} bash bench/ab_trees.sh "$AB_TREE" 1 python bench/optimizer_step.py --device cuda \
      --optimizer adam --gpt "$gpt" --profile --variants ${AB_VARIANTS:-ember-cuda}
  done
fi
# Nsight Compute on one step of each variant (memory and issue counters of every kernel; the
# 12-lane kernels of a GPT-2-size step are the same with a small vocabulary). A report each, and
# its details as text. The clocks are left alone (--clock-control none), as the device notes ask.
NCU_SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section InstructionStats"
ncu_part() {  # name, seconds, optimizer_step.py arguments...
  local name=$1 limit=$2; shift 2
  part "$name" "$limit" ncu --clock-control none --profile-from-start off $NCU_SECTIONS -f -o "$OUT/$name" \
    python bench/optimizer_step.py --device cuda --optimizer adam --ncu "$@"
  [[ -f "$OUT/$name.ncu-rep" ]] && ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/$name.details.txt" 2>&1
}
ncu_part ncu_small ${NCU_LIMIT:-240} --gpt 256,4,8192 --variants ${NCU_VARIANTS:-ember,ember-cuda}
ncu_part ncu_gpt2 ${NCU_LIMIT:-240} --gpt 768,12,1024 --variants ${NCU_VARIANTS:-ember,ember-cuda}
rm -rf "$OUT/cache-ignored"
