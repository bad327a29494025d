#!/usr/bin/env bash
# One device call for the optimizer steps on the GPU: the foreach tests on the device, the CUDA
# C++ combo kernels' unroll compared on a small GPT's Adam step, and the GPT-2-size step.
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
rm -rf "$OUT/cache-ignored"
