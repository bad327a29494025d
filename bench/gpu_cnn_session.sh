#!/usr/bin/env bash
# Device calls for CNN training work, a part per argument, each part's output in $OUT/<part>.txt:
#   tests      the GPU tests of split rows and columns and of split passes (EMBER_TEST_DEVICE=cuda)
#   cnn_f32    ResNet-18 training step, f32 NCHW: eager, Inductor, ember-triton, ember-cuda
#   cnn_bf16   the same in bf16 channels_last
#   fusion     bench/gpu_fusion.py's suite on Triton (plans of norms and losses over many rows)
#   batchnorm  bench/batchnorm.py: BatchNorm2d + ReLU steps at a ResNet-18's shapes
#   probe      bench/split_rows_probe.py: split row kernels against float64
#   unroll     bench/column_unroll_probe.py: rows a CUDA C++ column kernel's thread takes per step
#   choice     the GPU tests of timed choices and torch's AOTAutograd cache
#   warm       warm starts of the matmul cases, OLD (default .gl/old) against the working tree
#   triton     GPU tests of the Triton launch path (streams, CUDA graphs, wide offsets, device sizes)
#   writes     GPU tests of writes into inputs and over dying buffers, Triton then CUDA C++
#   optim      bench/optimizer_step.py (Adam, SGD) under OLD and the working tree
#   cnn_ab     ResNet-18 f32 step of ember-triton and ember-cuda under OLD and the working tree
#   cache      bench/cache_update.py (a KV cache's index_copy_ step) under OLD and the working tree
#   bn_ab      bench/batchnorm.py under OLD and the working tree
#   limit      the GPU-only test of the CUDA compile's time limit
#     PYTHONPATH=. bash bench/gpu_cnn_session.sh tests cnn_f32
set -uo pipefail
OUT=${OUT:-/tmp/ember-session}
mkdir -p "$OUT"
export EMBER_CACHE_DIR=${EMBER_CACHE_DIR:-/tmp/ember-cnn-cache}
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -d .whl ] && ! python -c "import expecttest" 2>/dev/null; then  # (OpInfo tests import it)
  pip install -q --no-deps --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-.}
fi
part() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$OUT/parts.txt"
}
CNN="python bench/cnn_step.py --device cuda --check-sizes 1 --top-kernels 8"
for p in "$@"; do
  case $p in
    tests) part tests 150 env EMBER_TEST_DEVICE=cuda python -m pytest -q -n 8 -p no:cacheprovider \
             tests/test_cuda_split_rows.py tests/test_cuda.py tests/test_split_passes.py ;;
    cnn_f32) part cnn_f32 330 $CNN --variants eager,inductor,ember-triton,ember-cuda ;;
    cnn_bf16) part cnn_bf16 300 $CNN --dtype bf16 --channels-last --variants eager,inductor,ember-triton,ember-cuda ;;
    fusion) part fusion 240 python bench/gpu_fusion.py --backends triton ;;
    batchnorm) part batchnorm 200 python bench/batchnorm.py ;;
    probe) part probe 150 env EMBER_AOT_CACHE=0 python bench/split_rows_probe.py ;;
    unroll) part unroll 240 env EMBER_AOT_CACHE=0 python bench/column_unroll_probe.py ;;
    choice) part choice 150 env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider \
              tests/test_choice.py tests/test_aot_cache.py ;;
    warm) part warm 330 bash bench/ab_trees.sh "${OLD:-.gl/old}" 1 python bench/warm_start.py --device cuda \
            --cases gelu_linear,swiglu --reps 3 --backends ember ;;
    triton) part triton 240 env EMBER_TEST_DEVICE=cuda python -m pytest -q -n 8 -p no:cacheprovider \
              tests/test_triton.py tests/test_gpu_streams.py tests/test_cuda_graph_calls.py tests/test_wide_index.py \
              tests/test_device_sizes.py tests/test_ragged_compile.py ;;
    writes) part writes 200 bash -c "EMBER_TEST_DEVICE=cuda python -m pytest -q -n 8 -p no:cacheprovider \
              tests/test_input_writes.py tests/test_inplace.py tests/test_grad_modes.py && EMBER_TEST_DEVICE=cuda \
              EMBER_GPU_BACKEND=cuda python -m pytest -q -n 8 -p no:cacheprovider tests/test_input_writes.py" ;;
    optim) part optim 300 bash -c "bash bench/ab_trees.sh ${OLD:-.gl/old} 1 python bench/optimizer_step.py \
             --device cuda && bash bench/ab_trees.sh ${OLD:-.gl/old} 1 python bench/optimizer_step.py --device cuda \
             --optimizer sgd --variants eager,ember" ;;
    cnn_ab) part cnn_ab 400 bash bench/ab_trees.sh "${OLD:-.gl/old}" 1 $CNN --variants eager,ember-triton,ember-cuda ;;
    cache) part cache 200 bash bench/ab_trees.sh "${OLD:-.gl/old}" 1 python bench/cache_update.py --device cuda ;;
    bn_ab) part bn_ab 420 bash bench/ab_trees.sh "${OLD:-.gl/old}" 1 python bench/batchnorm.py --device cuda ;;
    limit) part limit 120 env EMBER_TEST_DEVICE=cuda python -m pytest -q -p no:cacheprovider tests/test_cuda.py \
             -k compile_limit -rs ;;
    *) echo "unknown part $p" ;;
  esac
done
