#!/usr/bin/env bash
# One device call for the CUDA C++ backend's row kernels: their GPU tests, an A/B of the suite's
# row cases against an older tree (AB_TREE: its `ember` and `bench`, bench/ab_trees.sh), their
# instructions under Nsight Compute beside Triton's, and the whole suite on both backends.
# Each part's output goes to $OUT/<part>.txt; PARTS=a,b runs only those. Tests need expecttest
# (carry .whl/):
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#     PYTHONPATH=/tmp/site:. AB_TREE=build/abold bash bench/gpu_rows_session.sh
set -uo pipefail
source "$(dirname "$0")/session_parts.sh"  # $OUT, a fresh kernel cache, the GPU; part NAME SECONDS COMMAND...
ROWS=${ROWS:-softmax,cross_entropy,rmsnorm,layernorm}
part rows_tests 150 env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:logging -n 4 tests/test_cuda_online.py \
  tests/test_cuda_vectors.py tests/test_gpu_numerics.py tests/test_cuda_split_rows.py
if [[ -n "${AB_TREE:-}" ]]; then
  part ab_rows ${AB_LIMIT:-200} bash bench/ab_trees.sh "$AB_TREE" 2 python bench/case_calls.py --cases "$ROWS" \
    --backends cuda --time 30
fi
part ncu_rows ${NCU_LIMIT:-150} ncu --clock-control none --profile-from-start off --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section InstructionStats -f -o "$OUT/ncu_rows" \
  python bench/case_calls.py --cases "$ROWS" --backends triton,cuda
[[ -f "$OUT/ncu_rows.ncu-rep" ]] && ncu --import "$OUT/ncu_rows.ncu-rep" --page details > "$OUT/ncu_rows.details.txt" 2>&1
part ops_cuda ${OPS_LIMIT:-200} env EMBER_TEST_DEVICE=cuda EMBER_GPU_BACKEND=cuda python -m pytest -q -p no:logging -n 8 \
  tests/test_ops.py tests/test_training.py
part suite ${SUITE_LIMIT:-240} python bench/gpu_fusion.py --backends triton,cuda
rm -rf "$OUT/cache-ignored"
