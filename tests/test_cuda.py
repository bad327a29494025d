"""The CUDA backend, without a GPU: kernels rendered on the CPU (``ember.explain(..., target="cuda")``)
and compiled for Hopper with nvcc (sm_90 cubins), the structure of each launch strategy, launch
geometry, the on-disk cubin cache and the build errors. Running the kernels needs a GPU:
``EMBER_TEST_DEVICE=cuda EMBER_GPU_BACKEND=cuda pytest tests/test_ops.py`` on a GPU machine."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import ember
from ember.codegen import cuda
from ember.ir import shapes as sh
from ember.runtime import cuda_backend, cuda_launch
from ember.runtime.backend import BuildError, get_backend
from ember.workloads.giou import make_batch, padded_giou_loss

from .conftest import DEVICE
from .helpers import check, record_rendered
from .test_ops import _program, _samples
from .test_triton import CASES, OPS

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not installed")
SWEEP_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool)


def explain(fn, *args, dynamic=None) -> ember.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(fn, *args, target="cuda", dynamic=dynamic)
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]
    assert all(k.backend == "cuda" for k in report.kernels)
    return report


def sources(report: ember.Report, tag: str) -> list[str]:
    """The report's kernels, renamed apart (one .cu file holds the kernels of many reports)."""
    out = []
    for k in report.kernels:
        assert 'extern "C" __global__' in k.source and "ember_err" not in k.source, k.source
        out.append(re.sub(rf"\b{re.escape(k.name)}(?=(_body|_i64)?\b)", f"{k.name}_{tag}", k.source))
    return out


def nvcc(kernels: list[str], path, wide: bool = False) -> str | None:
    """Compile kernels with the CUDA prelude to an sm_90 cubin (``wide``: their 64-bit-index
    entry points); the error text if that fails."""
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(kernels) + "\n")
    cubin = path.with_suffix(".i64.cubin" if wide else ".cubin")
    cmd = [NVCC, "-cubin", "-arch=sm_90", "-std=c++17", *([cuda_backend.WIDE_INDEX] if wide else []),
           "-o", str(cubin), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return None if proc.returncode == 0 else f"{path}{' (wide)' if wide else ''}:\n{proc.stderr[-4000:]}"


# The prelude's bfloat16 and float16 conversions (ember_bf16_to_f32, ember_f32_to_f16, ...): the same
# signatures (float, and the bits as unsigned short), so a float16 kernel that is a bfloat16 one but
# for which of them it calls compiles as that one does. (test_scans' sm_90 sweep and
# test_cuda_vectors' PTX tests compile float16 kernels of their own, so the float16 ones are built.)
HALF_CONVERSIONS = re.compile(r"\b(ember_(?:\w*?_)?)b?f16(?=\b|_)")


def unique(kernels: list[str]) -> list[str]:
    """The kernels less those identical to an earlier one but for their (renamed) names and which
    16-bit float they convert to and from."""
    seen, out = set(), []
    for source in kernels:
        name = re.match(r"// (\w+): ", source)
        key = re.sub(rf"\b{name[1]}(?=(_body|_i64)?\b)", "K", source) if name else source
        key = HALF_CONVERSIONS.sub(r"\1h16", key)
        if key not in seen:
            seen.add(key)
            out.append(source)
    return out


def compile_batches(kernels: list[str], tmp_path, per_file: int) -> None:
    """Each batch twice: its 32-bit-index entry points, and (as the backend builds them when a
    launch needs them) its 64-bit ones. Kernels identical but for their names compile once."""
    kernels = unique(kernels)
    batches = [kernels[i:i + per_file] for i in range(0, len(kernels), per_file)]
    jobs = [(i, batch, wide) for i, batch in enumerate(batches) for wide in (False, True)]
    with ThreadPoolExecutor(2) as pool:
        errors = list(pool.map(lambda j: nvcc(j[1], tmp_path / f"batch{j[0]}_{int(j[2])}.cu", j[2]), jobs))
    failed = [e for e in errors if e]
    assert not failed, "\n\n".join(failed)


# ---- every generated kernel compiles for sm_90 --------------------------------------------------

@needs_nvcc
def test_fusion_patterns_compile_for_sm90(tmp_path):
    kernels = []
    for i, (fn, make) in enumerate(CASES.values()):
        kernels += sources(explain(fn, *make()), f"c{i}")
    assert len(kernels) >= len(CASES)
    compile_batches(kernels, tmp_path, per_file=len(kernels))


@needs_nvcc
def test_opinfo_kernels_compile_for_sm90(tmp_path):
    """The kernels of tests/test_triton.py's OpInfo sweep, in every dtype it covers."""
    kernels = []
    for i, op in enumerate(o for o in op_db if o.name in OPS and not o.variant_test_name):
        # (two samples a dtype, the kernels of the rest being alike; every dtype's in one program,
        # one trace an op: the kernels of samples of one shape fuse, each dtype's code in them)
        samples = [s for dtype in SWEEP_DTYPES if dtype in op.supported_dtypes("cpu") for s in _samples(op, dtype)[:2]]
        tensors = [flat[p] for flat, _, positions, _ in samples for p in positions]
        kernels += sources(explain(_program(op, samples), *tensors), f"op{i}")
    # (a kernel's body each, the parts of combos too: codegen/cuda_combos.py)
    assert sum(source.count("__device__ __forceinline__ void") for source in kernels) > 40
    compile_batches(kernels, tmp_path, per_file=-(-len(kernels) // 2))  # one file per nvcc worker


@needs_nvcc
def test_a_saved_value_named_after_a_math_function_does_not_hide_it(tmp_path):
    # AOTAutograd names the saved sqrt(p) "sqrt"; as a kernel parameter of that name it hid
    # CUDA's sqrt() from the std the same backward kernel recomputes: the kernel failed to build
    # and ran through ATen (GPU fuzz seed 317377345058). Unnumbered input names get "_in".
    def fn(x):
        p = torch.softmax(x, dim=0)
        s = p.std(dim=-2, keepdim=True, correction=0)
        return torch.sqrt(p.abs()), torch.where(p > s, p, s)

    x = torch.randn(3, 300, dtype=torch.float16, requires_grad=True)
    ups = [torch.randn(3, 300, dtype=torch.float16) for _ in range(2)]
    report = explain(lambda x, *ups: torch.autograd.backward(fn(x), list(ups)), x, *ups)
    params = re.findall(r"void \w+_body\(([^)]*)\)", "\n".join(k.source for k in report.kernels))
    names = {p.split()[-1] for group in params for p in group.split(",")}
    assert "sqrt_in" in names and "sqrt" not in names, names
    assert nvcc(sources(report, "t"), tmp_path / "named.cu") is None


# ---- what each strategy looks like ----------------------------------------------------------

def test_pointwise_kernel_is_a_grid_stride_loop():
    report = explain(lambda x, y: torch.relu(x) * y + 1, torch.randn(64, 33), torch.randn(33))
    (k,) = report.kernels
    src = k.source
    assert "// strategy: pointwise" in src
    assert "ember_i_tile += (I)gridDim.x * blockDim.x * EMBER_UNROLL)" in src
    assert "#pragma unroll\n" in src and "for (int ember_u = 0; ember_u < EMBER_UNROLL; ++ember_u)" in src
    assert "const I ember_i = ember_i_tile + (I)ember_u * blockDim.x;" in src and "if (ember_i < ember_n)" in src
    assert "const int64_t o0 = (int64_t)(ember_i / (I)33);" in src
    assert f'extern "C" __global__ void __launch_bounds__(256) {k.name}(const float* __restrict__' in src
    assert f"{k.name}_body<uint32_t>(" in src and f"{k.name}_body<int64_t>(" in src


def test_softmax_rows_reduce_max_and_sum_across_the_block():
    (k,) = explain(lambda x: torch.softmax(x, -1), torch.randn(9, 70)).kernels
    src = k.source
    assert "// strategy: rows" in src
    assert ("for (I ember_row = (I)blockIdx.x * blockDim.y + threadIdx.y; ember_row < ember_rows; "
            "ember_row += (I)gridDim.x * blockDim.y)") in src  # (blockDim.y rows a block where short)
    assert "// loop 1: amax" in src and "// loop 2: sum" in src and "// loop 3: store" in src
    loop = ("for (I ember_r_tile = (I)threadIdx.x; ember_r_tile < ember_inner; "
            "ember_r_tile += (I)blockDim.x * EMBER_UNROLL)")
    assert src.count(loop) == 3
    assert "ember_row_reduce(acc1, EmberMaxOp(), -(float)INFINITY, ember_smem)" in src
    assert "ember_row_reduce(acc4, EmberSumOp(), (float)0, ember_smem)" in src
    # exp and float32 division as Triton's (ex2.approx, div.full.f32), not CUDA's expf and IEEE
    # division: those took several times the instructions of a row kernel bound by issue
    assert "ember_exp_approx(" in src and "expf(" not in src and "ember_div_full(" in src


def test_giou_loss_combines_block_partials_in_the_last_block():
    pred, _, padded = make_batch(64)
    report = explain(padded_giou_loss, pred, padded)
    (k,) = report.kernels
    src = k.source
    assert "// strategy: full reduction, many blocks" in src
    assert "double* __restrict__ workspace, int* __restrict__ counter" in src
    assert "workspace[0 * EMBER_MAX_BLOCKS + blockIdx.x] = (double)" in src
    assert "__threadfence();" in src and "ember_last = atomicAdd(counter, 1) == (int)gridDim.x - 1;" in src
    assert "if (ember_last) {" in src and "*counter = 0;" in src
    assert src.index("if (ember_last) {") < src.index("buf0[0] = ")  # the epilogue runs in the last block


def test_reductions_over_a_leading_dim_give_lanes_adjacent_rows():
    """x.sum(0): a row's elements are far apart, adjacent rows' are adjacent: lanes take rows."""
    (k,) = explain(lambda x: x.sum(0), torch.randn(64, 48)).kernels
    src = k.source
    assert "// strategy: columns" in src and "ember_column_reduce(acc1, EmberSumOp(), ember_smem)" in src
    assert "const I ember_row = ember_active ? ember_rows0 + ember_lane : ember_rows - 1;" in src
    assert "if (ember_active && ember_warp == 0) {" in src and "ember_r_tile += ember_step" in src
    # the inner domain in gridDim.y slices, each block's partials to the workspace, the group's
    # last block adding them up in slice order (the launcher picks the slices)
    assert "const I ember_r_begin = (I)blockIdx.y * ember_slice;" in src
    assert "ember_last = atomicAdd(&counter[ember_rows0 / 32], 1) == (int)gridDim.y - 1;" in src
    assert "for (unsigned ember_s = 0; ember_s < gridDim.y; ++ember_s)" in src
    (k,) = explain(lambda x: x.argmax(0), torch.randn(64, 48)).kernels
    assert "// strategy: columns" in k.source and "gridDim.y" not in k.source  # (arg-reductions stay whole)
    (k,) = explain(lambda x: x.sum(1), torch.randn(64, 48)).kernels
    assert "// strategy: rows" in k.source


def test_column_sums_over_few_groups_split_their_rows():
    plan = cuda_launch.plan_launch
    # a bias gradient: 4096 columns (128 groups of 32) over 8192 rows: 8 slices of 1024 rows
    assert plan("columns", 4096, 8192, 132, 512, split=True) == (False, (128, 8), 512)
    assert plan("columns", 4096, 8192, 132, 512) == (False, 128, 512)  # (a kernel that cannot split)
    assert isinstance(plan("columns", 65536, 8192, 132, 512, split=True)[1], int)  # groups to spare
    assert plan("columns", 48, 600, 132, 512, split=True)[1] == (2, 2)  # ≥ SLICE_ROWS rows a slice
    assert plan("columns", 48, 300, 132, 512, split=True)[1] == 2
    # a channels_last BatchNorm's sums: 64 channels of 802816, 256 slices (about 4 blocks an SM)
    assert plan("columns", 64, 802816, 132, 512, split=True) == (False, (2, 256), 512)


def test_column_scans_take_a_warp_per_segment_of_the_scanned_dim():
    plan = cuda_launch.plan_launch
    # x.cumsum(0) over 4096 x 4096: 128 groups of 32 columns, 16 segments of 256 rows each
    assert plan("scan_columns", 4096, 4096, 132, 512) == (False, 128, 512)
    # segments of 32 rows at least: 100 rows take 3 warps' worth, rounded down to 2
    assert plan("scan_columns", 70, 100, 132, 512) == (False, 3, 64)
    assert plan("scan_columns", 70, 5, 132, 512)[2] == 32


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_split_column_sums_match_eager_on_the_gpu(dtype):
    # gelu's backward and its bias gradient (the gradient stored by each slice as it sums it), a
    # mean and a max over the same rows; groups of rows past the last row, slices past the end
    def grads(g, y):
        d = torch.ops.aten.gelu_backward(g, y)
        return d, d.sum(0), (d * y).mean(0), y.amax(0)

    options = {"gpu_backend": "cuda"}
    # (float32 sums of thousands of terms in another order: columns that nearly cancel differ
    # from eager's by more than float32's default absolute tolerance)
    tol = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {}
    for rows, cols in ((8192, 4096), (5000, 100), (1000, 33), (300, 7), (70000, 40)):  # (256 slices)
        g = torch.randn(rows, cols, dtype=dtype, device="cuda")
        y = torch.randn(rows, cols, dtype=dtype, device="cuda")
        for _ in range(2):  # the second call finds the counters the first one left
            check(grads, g, y, options=options, **tol)
    check(grads, g, y, options=options, dynamic=True, **tol)


def test_arg_reductions_and_single_block_full_reductions():
    report = explain(lambda x: (x.argmax(-1), x.argmin()), torch.randn(7, 13))
    rows, full = report.kernels
    assert "ember_row_reduce(acc1, EmberArgMaxOp(), EmberArg<float>{-(float)INFINITY, INT64_MAX}" in rows.source
    assert "if (threadIdx.x == 0) {  // outer results" in rows.source
    assert "// strategy: full reduction, one block" in full.source and "EmberArgMinOp()" in full.source
    assert "workspace" not in full.source


def test_16_bit_floats_are_bits_converted_by_intrinsics():
    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    (k,) = explain(rmsnorm, torch.randn(20, 50).bfloat16(), torch.randn(50).bfloat16()).kernels
    assert "const unsigned short* __restrict__ arg0_1" in k.source
    assert "ember_bf16_to_f32(arg0_1[" in k.source and "ember_f32_to_bf16(" in k.source
    assert "rsqrtf(" in k.source
    for helper in ("__uint_as_float((unsigned int)h << 16)", 'asm("cvt.f32.f16 %0, %1;"',
                   'asm("cvt.rn.f16.f32 %0, %1;"', "EMBER_ROUNDED_DIVISION(bf16, ember_round_bf16)",
                   "EMBER_ROUNDED_DIVISION(f16, ember_round_f16)", "__shfl_xor_sync"):
        assert helper in cuda.PRELUDE
    assert "#include" not in cuda.PRELUDE.split("#else")[0]  # nothing to include under NVRTC


def test_no_error_flag_on_the_gpu():
    """Integer division by zero does not raise on the GPU (nor in eager); an out-of-range gather
    is a device-side assert (as in eager), not a flag the host reads (test_gpu_index_asserts.py)."""
    a, b = torch.randint(-50, 50, (8, 9)), torch.randint(1, 7, (8, 9))
    idx = torch.randint(0, 9, (8, 3))
    report = explain(lambda a, b, i: (a // b, a % b, torch.fmod(a, b), torch.gather(a, 1, i)), a, b, idx)
    backend = get_backend("cuda")
    for k in report.kernels:
        assert "ember_err" not in k.source and not backend.uses_error_flag(k)
    text = "\n".join(k.source for k in report.kernels)
    assert "ember_floordiv((int64_t)" in text and "ember_assert_index(" in text
    assert "error_flag" not in report.graphs[0].wrapper
    assert "ember_err" not in cuda.PRELUDE.split("ember_truncdiv(int64_t a, int64_t b) {")[1].split("\n")[0]


# ---- launching --------------------------------------------------------------------------------

def test_launch_geometry():
    sms, plan = 132, cuda_launch.plan_launch
    # pointwise: 256 threads, 4 elements each per iteration, a block per iteration's tile
    assert plan("pointwise", 3300, 1, sms, 1024) == (False, 4, 256)
    assert plan("pointwise", 2**31, 1, sms, 1024)[0] is True  # 64-bit indices
    # ... up to WAVES waves of the device (8 blocks of 256 per SM); beyond, several tiles a block
    tiles = 10**9 // 1024 + 1
    assert plan("pointwise", 10**9, 1, sms, 1024) == (False, -(-tiles // (tiles // (sms * 8 * 16))), 256)
    # rows: a block per row, each thread at least 2 x 4 elements of it, 32 to 512 threads
    assert plan("rows", 9, 70, sms, 1024) == (False, 9, 32)
    assert plan("rows", 16384, 1024, sms, 1024) == (False, 16384, 128)
    assert plan("rows", 10**5, 8192, sms, 1024) == (False, -(-10**5 // 11), 512)  # 11 rows a block
    assert plan("rows", 10**5, 8192, sms, 384) == (False, 10**5 // 5, 256)  # register-bound kernel
    assert plan("rows", 10**6, 4096, sms, 1024)[0] is True
    assert plan("rows", 5, 0, sms, 1024) == (False, 5, 32)  # empty rows still store their results
    # the driver's occupancy, where given, counts the blocks the device runs at once
    assert plan("rows", 10**5, 8192, sms, 1024, occupancy=lambda block: sms * 2) == (False, -(-10**5 // 23), 512)
    assert plan("rows", 10**5, 8192, sms, 1024, occupancy=lambda block: 0) == plan("rows", 10**5, 8192, sms, 1024)
    # columns: 32 rows per block, warps split the inner domain
    assert plan("columns", 8192, 8192, sms, 1024) == (False, 256, 512)
    assert plan("columns", 13, 7, sms, 1024) == (False, 1, 32)
    # full reductions: up to MAX_BLOCKS blocks combined by the last, or one block
    assert plan("full", 1, 4096, sms, 1024) == (False, 2, 512)
    assert plan("full", 1, 2**26, sms, 1024) == (False, sms * 4, 512)
    assert plan("full", 1, 2**26, sms, 1024, occupancy=lambda block: sms) == (False, sms, 512)
    assert plan("single", 1, 91, sms, 1024) == (False, 1, 32)
    assert plan("single", 1, 10**7, sms, 1024) == (False, 1, 512)


@needs_nvcc
def test_transposed_kernels_stage_through_shared_memory_tiles(kernels_of, tmp_path):
    """A pointwise kernel reading along its second-to-last dim runs in square tiles: the
    transposed input staged through shared memory with the lanes along its rows, the statements
    with the lanes along the columns; a transposed output goes back the same way."""
    bf16 = torch.bfloat16
    (k,), report = kernels_of(lambda x: (x.t() * 2).contiguous(), torch.randn(70, 33, dtype=bf16), dynamic=True)
    src = report.kernels[0].source
    assert "// strategy: tiles" in src and "__launch_bounds__(256)" in src
    # (rows of 66 2-byte elements: 33 words, so a warp down a column touches every bank once)
    assert re.search(r"__shared__ unsigned short ember_tile0\[64\]\[66\];  // arg\d+_1, read along the rows", src)
    staged = r"ember_tile0\[threadIdx.y \+ ember_j\]\[threadIdx.x \+ ember_l\] = arg\d+_1\[o0 \+ o1\*s\d+\];"
    assert re.search(staged, src), src  # lanes down x's rows
    assert "ember_bf16_to_f32(ember_tile0[threadIdx.x + ember_l][threadIdx.y + ember_j])" in src
    assert re.search(r"buf0\[o0\*s\d+ \+ o1\] = ", src)  # the output along its own rows: lanes along the columns
    assert src.count("__syncthreads();") == 2  # staged, and free for the next tile
    meta = cuda.launch_meta(k)  # 33 rows of 70 columns
    assert (meta["strategy"], meta["max_threads"], meta["tile"]) == ("tiles", 256, 64)
    assert (meta["outer"], meta["inner"]) == (str(k.outer[0]), str(k.outer[1]))  # the output's rows, columns
    # a small static kernel: tiles of 32 (more of them to spread over the GPU)
    (k,), report = kernels_of(lambda x: (x.t() * 2).contiguous(), torch.randn(70, 33, dtype=bf16))
    assert cuda.launch_meta(k)["tile"] == 32 and "ember_tile0[32][34];" in report.kernels[0].source
    # x.mT + y: the output is laid out as x is (as eager does) and the loops walk its memory
    # (schedule/loops.py): x read and the output written along their rows, y staged in
    (k,), report = kernels_of(lambda x, y: x.mT + y, torch.randn(4, 64, 48), torch.randn(4, 48, 64))
    src = report.kernels[0].source
    assert "ember_tile0[32][33];  // arg1_1, read along the rows" in src and "ember_tile1" not in src
    assert "ember_tile0[threadIdx.y + ember_j][threadIdx.x + ember_l] = arg1_1[3072*o0 + 64*o2 + o1];" in src
    assert src.count("__syncthreads();") == 2
    # symbolic sizes take tiles of 64 (one float64 tile of 64 x 65 too), but two float64 tiles of
    # 64 x 65 would take 65 KB of shared memory: 32 x 33 ones
    x, y = torch.randn(4, 64, 48), torch.randn(4, 48, 64)
    (k,), _ = kernels_of(lambda x, y: x.mT + y, x, y, dynamic=True)
    assert cuda.launch_meta(k)["tile"] == 64
    (k,), _ = kernels_of(lambda x, y: x.mT + y, x.double(), y.double(), dynamic=True)
    assert cuda.launch_meta(k)["tile"] == 64
    (k,), report = kernels_of(lambda x, z: (x.mT + z.mT).contiguous(), x.double(), x.double(), dynamic=True)
    assert cuda.launch_meta(k)["tile"] == 32 and "ember_tile1[32][33];" in report.kernels[0].source
    # along the last dim, broadcast down the rows, or too short a dim: no tiles
    for fn, args in ((lambda x: x * 2, (torch.randn(64, 64),)),
                     (lambda x, b: x + b, (torch.randn(64, 64), torch.randn(64, 1))),
                     (lambda x: x.t() * 2, (torch.randn(64, 8),))):
        (k,), _ = kernels_of(fn, *args)
        assert cuda.strategy(k) == "pointwise"
    # every tiled kernel compiles for sm_90, in several dtypes, with symbolic sizes, 64-bit indices
    kernels = []
    for i, dtype in enumerate((torch.float32, torch.float64, bf16, torch.int64, torch.bool)):
        x, y = torch.ones(3, 40, 65, dtype=dtype), torch.ones(3, 65, 40, dtype=dtype)
        for j, dynamic in enumerate((False, True)):
            kernels += sources(explain(lambda x, y, bool_=dtype == torch.bool: (x.permute(0, 2, 1) & y if bool_
                                                                                 else x.permute(0, 2, 1) * y),
                                       x, y, dynamic=dynamic),
                               f"t{i}{j}")
    assert all("// strategy: tiles" in s for s in kernels)
    compile_batches(kernels, tmp_path, per_file=len(kernels))


def test_tiles_launch_a_block_of_32_x_8_threads_a_tile():
    """64 x 64 tiles (32 x 32 where shared memory is short), each a block of 32 x 8 threads."""
    sms, plan = 132, cuda_launch.plan_launch
    assert plan("tiles", 8192, 8192, sms, 256) == (False, 128 * 128, (32, 8))  # a tile a block, up to WAVES waves
    assert plan("tiles", 8192, 8192, sms, 256, tile=32) == (False, -(-256 * 256 // 3), (32, 8))  # then a few
    assert plan("tiles", 33, 70, sms, 256, tile=32) == (False, 2 * 3, (32, 8))  # tiles partly past either end
    assert plan("tiles", 1 << 16, 1 << 16, sms, 256)[0] is True  # 64-bit indices


@pytest.mark.parametrize("resident", [1, 7, 1056, 4224])
def test_balanced_grids_take_one_tile_a_block_then_equal_shares(resident):
    """Every tile is covered; up to WAVES waves a block takes one tile; beyond, the blocks' shares
    differ by at most one tile and the grid stays within WAVES waves (and above half of it)."""
    waves = cuda_launch.WAVES
    for tiles in (1, resident, resident * waves, resident * waves + 1, resident * waves * 3 - 1, 10**7 + 3):
        grid = cuda_launch.balanced_grid(tiles, resident)
        per_block = -(-tiles // grid)
        assert grid * per_block >= tiles and (grid - 1) * per_block < tiles
        if tiles < 2 * resident * waves:
            assert grid == tiles
        else:
            assert resident * waves / 2 <= grid <= resident * waves * 2


@pytest.fixture
def kernels_of(monkeypatch):
    """fn, *args -> the kernel IR objects the CUDA backend rendered for them."""
    seen = record_rendered(monkeypatch, cuda_backend.CudaBackend)

    def kernels(fn, *args, dynamic=None):
        seen.clear()
        report = explain(fn, *args, dynamic=dynamic)
        return list(seen), report

    return kernels


def test_launch_meta(kernels_of):
    (k,), _ = kernels_of(lambda x: torch.softmax(x, -1), torch.randn(9, 70), dynamic=True)
    meta = cuda.launch_meta(k)
    assert meta["strategy"] == "rows" and not meta["workspace"] and meta["max_threads"] == 512
    assert meta["n_params"] == 2 and meta["kernels"] == {"i32": k.name, "i64": f"{k.name}_i64"}
    # element counts are Python expressions of the size symbols, as the kernel IR's extents
    assert meta["sizes"] == [s.name for s in k.sizes] and len(k.sizes) == 2
    values = dict(zip(k.sizes, (9, 70)))
    count = lambda e: eval(f"lambda {', '.join(meta['sizes'])}: {e}")(*values.values())
    assert count(meta["outer"]) == int(sh.numel(k.outer).subs(values))
    assert count(meta["inner"]) == int(sh.numel(k.inner).subs(values))
    assert count(meta["outer"]) * count(meta["inner"]) == 9 * 70
    (giou,), _ = kernels_of(padded_giou_loss, *make_batch(16)[::2])
    meta = cuda.launch_meta(giou)
    assert meta["strategy"] == "full" and meta["workspace"] and meta["n_reductions"] == 2
    assert cuda.render_module([k, giou]).startswith(cuda.PRELUDE)


class FakeDriver:
    """The few driver calls a launch makes; launches are recorded by function."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_CONTEXT = 201

    def __init__(self):
        self.launched, self.geometry = [], []

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, fn, block, smem):
        return 0, 8

    def CUstream(self, raw):
        return raw

    def cuLaunchKernel(self, fn, *geometry_stream_args):
        self.launched.append(fn)
        self.geometry.append(geometry_stream_args[:6])  # grid x y z, block x y z
        return (0,)


class FakeWideModule:
    def __init__(self, error: Exception | None = None):
        self.asked, self.error = [], error

    def function(self, device, name):
        self.asked.append(name)
        if self.error:
            raise self.error
        return "i64 entry"


def test_64_bit_entry_points_build_at_the_first_launch_that_needs_them(kernels_of, monkeypatch):
    """The build loads the 32-bit entry points; a 64-bit one is asked for (compiled, once per
    module) only when a launch reaches 2^31 elements. If it fails to build, that kernel's ops run
    through ATen from then on, with one warning."""
    (k,), _ = kernels_of(lambda x: x.exp() + 1, torch.randn(4, 5), dynamic=True)
    meta = cuda.launch_meta(k)
    driver = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_backend, "_current_device", lambda: 0)
    monkeypatch.setattr(cuda_backend, "_current_stream", lambda device: 7)

    def launcher(wide, fallback=None):
        kernel = cuda_backend.CudaKernel(k.name, meta, None, wide, fallback)
        kernel._devices[0] = {"functions": ["i32 entry", None], "max_threads": 1024, "sms": 132,
                              "geometry": {}, "workspaces": {}, "resident": {}}
        return kernel

    pointers = (1,) * meta["n_params"]
    small, big, bigger = (4, 5), (1 << 16, 1 << 15), (1 << 16, 1 << 16)
    wide = FakeWideModule()
    kernel = launcher(wide)
    kernel(*pointers, *small)
    assert driver.launched == ["i32 entry"] and wide.asked == []
    kernel(*pointers, *big)
    kernel(*pointers, *bigger)
    assert driver.launched == ["i32 entry", "i64 entry", "i64 entry"] and wide.asked == [f"{k.name}_i64"]

    ran_through_aten = []
    kernel = launcher(FakeWideModule(BuildError("ptxas ran out of registers")),
                      lambda *args: ran_through_aten.append(args[meta["n_params"]:]))
    driver.launched.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sizes in (small, big, small):
            kernel(*pointers, *sizes)
    assert driver.launched == ["i32 entry"] and ran_through_aten == [big, small]
    assert [str(w.message) for w in caught if "failed to compile or launch" in str(w.message)] == [
        f"ember: CUDA kernel {k.name} failed to compile or launch (BuildError: ptxas ran out of registers); "
        "its ops run through ATen instead."]


def workspace_launcher(monkeypatch, k, meta) -> tuple[cuda_backend.CudaKernel, FakeDriver, list]:
    """A launcher of ``k`` on a fake driver and device (132 SMs), and the list its workspace
    allocations go to: ("partials", n) and ("counters", n)."""
    driver = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_backend, "_current_device", lambda: 0)
    monkeypatch.setattr(cuda_backend, "_current_stream", lambda device: 7)
    allocated = []
    monkeypatch.setattr(torch, "empty", lambda n, **kw: allocated.append(("partials", n)) or torch.ones(1))
    monkeypatch.setattr(torch, "zeros", lambda n, **kw: allocated.append(("counters", n)) or torch.ones(1))
    kernel = cuda_backend.CudaKernel(k.name, meta, None, None)
    kernel._devices[0] = {"functions": ["i32 entry", None], "max_threads": 512, "sms": 132,
                          "geometry": {}, "workspaces": {}, "resident": {}}
    return kernel, driver, allocated


def test_split_column_launches_grow_their_workspace(kernels_of, monkeypatch):
    """A bias gradient's sums launch (groups of 32 columns, slices) blocks, with a workspace of a
    partial per slice, column and reduction and a counter per group; a larger call gets a larger
    workspace, and the smaller stays alive (a captured CUDA graph may launch with it)."""
    def grads(g, y):
        d = torch.ops.aten.gelu_backward(g, y)
        return d, d.sum(0)

    (k,), _ = kernels_of(grads, torch.randn(64, 48), torch.randn(64, 48), dynamic=True)
    meta = cuda.launch_meta(k)
    assert meta["split_columns"] and meta["workspace"] and meta["strategy"] == "columns"
    kernel, driver, allocated = workspace_launcher(monkeypatch, k, meta)
    sizes = {meta["outer"]: 4096, meta["inner"]: 8192}  # (columns, rows)
    kernel(*(1,) * meta["n_params"], *[sizes[size] for size in meta["sizes"]])
    assert driver.geometry[-1][:2] == (128, 8) and allocated == [("partials", 8 * 4096), ("counters", 128)]
    kernel(*(1,) * meta["n_params"], *[sizes[size] for size in meta["sizes"]])
    assert len(allocated) == 2  # the same workspace
    sizes = {meta["outer"]: 2048, meta["inner"]: 65536}  # 64 groups: 16 slices, 8 x 4096 partials still
    kernel(*(1,) * meta["n_params"], *[sizes[size] for size in meta["sizes"]])
    assert driver.geometry[-1][:2] == (64, 16) and len(allocated) == 2
    sizes = {meta["outer"]: 4128, meta["inner"]: 8192}  # 129 groups: 8 x 4128 partials, doubled
    kernel(*(1,) * meta["n_params"], *[sizes[size] for size in meta["sizes"]])
    assert driver.geometry[-1][:2] == (129, 8) and allocated[2:] == [("partials", 2 * 8 * 4096), ("counters", 129)]
    assert len(kernel._devices[0]["retired"]) == 1


@pytest.mark.parametrize("width, group", [(16, 1), (64, 4), (130, 16), (1000, 0)])
def test_short_rows_go_several_to_a_block(kernels_of, monkeypatch, width, group):
    """A softmax over rows shorter than a warp's iteration launches blocks of (group, rows):
    a group of lanes per row, 256 threads a block; longer rows keep a block each."""
    (k,), _ = kernels_of(lambda x: torch.softmax(x, -1), torch.randn(5000, width), dynamic=True)
    meta = cuda.launch_meta(k)
    assert meta["row_groups"] and meta["vector"] == 4
    driver = FakeDriver()
    monkeypatch.setattr(cuda_backend, "_driver", lambda: driver)
    monkeypatch.setattr(cuda_backend, "_current_device", lambda: 0)
    monkeypatch.setattr(cuda_backend, "_current_stream", lambda device: 7)
    kernel = cuda_backend.CudaKernel(k.name, meta, None, None)
    kernel._devices[0] = {"functions": ["i32 entry", None], "max_threads": 1024, "sms": 132,
                          "geometry": {}, "workspaces": {}, "resident": {}}
    value = {meta["outer"]: 5000, meta["inner"]: width}
    kernel(*(1,) * meta["n_params"], *[value[size] for size in meta["sizes"]])
    ((grid, _, _, bx, by, bz),) = driver.geometry
    if group:
        assert (bx, by, bz) == (group, 256 // group, 1) and grid == -(-5000 // by)
    else:
        assert (by, bz) == (1, 1) and bx >= 32 and grid == 5000


def test_row_groups_where_rows_may_be_short():
    """Row groups reduce among their own lanes. A reduction over all rows (CE's mean) combines the
    block's groups' shares in group order, and one thread of the block writes its partial. A
    chunked kernel's run of rows (column sums beside row reductions) keeps a block; so do rows
    statically too long for groups, whose reductions then skip the groups' branch."""
    x, t = torch.randn(64, 10), torch.randint(0, 10, (64,))
    (ce,) = explain(lambda x, t: F.cross_entropy(x, t), x, t).kernels
    (sm,) = explain(lambda x: torch.softmax(x, -1), x).kernels
    # (rows enough for a run per 4 of them on a machine of up to 32 host threads: explain's CPU
    # tensors take their run count from the host, chunks.chunk_count)
    chunked = explain(lambda x: (torch.softmax(x, -1) * 2, (x * x).sum(0)), torch.randn(1024, 10)).kernels[0]
    (long_rows,) = explain(lambda x: torch.softmax(x, -1), torch.randn(4, 4096)).kernels
    for k in (sm, ce):
        assert "blockIdx.x * blockDim.y + threadIdx.y" in k.source and "ember_row_reduce(" in k.source
    assert "__shared__ float ember_groups0[256];" in ce.source
    assert "ember_groups0[threadIdx.y] = acc" in ce.source
    assert "if (threadIdx.x == 0 && threadIdx.y == 0) {" in ce.source
    assert "ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x" in long_rows.source
    for k in (chunked, long_rows):
        assert "threadIdx.y" not in k.source and "ember_row_reduce(" not in k.source
        assert "ember_block_reduce(" in k.source
    plan = cuda_launch.plan_launch
    assert plan("rows", 64, 10, 132, 1024, row_groups=True)[2] == (2, 128)
    assert plan("rows", 64, 10, 132, 1024, row_groups=False)[2] == 32
    assert plan("rows", 64, 10, 132, 128, row_groups=True)[2] == (2, 64)  # a register-bound kernel
    assert plan("rows", 64, 0, 132, 1024, row_groups=True)[2] == (1, 256)  # empty rows: a thread each


def test_explain_renders_cuda_kernels_on_a_cpu_machine():
    report = explain(F.gelu, torch.randn(8, 32))
    (k,) = report.kernels
    assert k.backend == "cuda" and not k.built and "ember_one_plus_erf(" in k.source
    # the host program says why the kernel's ops run through ATen here: not a failed build
    assert f"# {k.name} rendered for cuda, not built on this cpu machine" in report.graphs[0].wrapper
    assert "failed to build" not in report.graphs[0].wrapper


def test_build_without_cuda_python_is_a_build_error(monkeypatch):
    for name in ("cuda", "cuda.bindings", "cuda.bindings.driver"):  # importing them raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    cuda_backend._driver.cache_clear()
    try:
        with pytest.raises(BuildError, match="needs NVIDIA's cuda-python"):
            get_backend("cuda").build_module([], ember.config)
    finally:
        cuda_backend._driver.cache_clear()


# ---- compiling and caching ------------------------------------------------------------------------

@needs_nvcc
def test_cubins_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_backend, "_nvrtc", lambda: None)  # the nvcc path, wherever NVRTC exists
    cuda_backend.compiler_id.cache_clear()
    try:
        (k,) = explain(lambda x: x.exp() + 1, torch.randn(4, 5)).kernels
        source = cuda.PRELUDE + "\n" + k.source + "\n"
        image, cached, path = cuda_backend.compile_module(source, "sm_90", tmp_path)
        assert not cached and image[:4] == b"\x7fELF" and path.read_bytes() == image
        assert path.with_suffix(".cu").read_text() == source and path.parent == tmp_path / "cuda"
        again, cached, path2 = cuda_backend.compile_module(source, "sm_90", tmp_path)
        assert cached and again == image and path2 == path
        path.write_bytes(image[:len(image) // 2])  # damaged outside ember: built again, not loaded
        rebuilt, cached, _ = cuda_backend.compile_module(source, "sm_90", tmp_path)
        assert not cached and rebuilt == image and path.read_bytes() == image
        assert cuda_backend.compile_module(source, "sm_80", tmp_path)[2] != path  # the key covers the arch
        # one entry point per compile: the 64-bit one only with EMBER_WIDE_INDEX
        wide, cached, wide_path = cuda_backend.compile_module(source, "sm_90", tmp_path, wide=True)
        assert not cached and wide_path != path and wide[:4] == b"\x7fELF"
        assert k.name.encode() + b"\0" in image and f"{k.name}_i64".encode() not in image
        assert f"{k.name}_i64".encode() + b"\0" in wide and k.name.encode() + b"\0" not in wide
        with pytest.raises(BuildError, match="error"):
            cuda_backend.compile_module(source + "this is not C++;\n", "sm_90", tmp_path)
    finally:
        cuda_backend.compiler_id.cache_clear()


def test_nvrtc_compiles_a_module():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        pytest.skip("NVRTC's Python bindings (cuda-bindings, nvidia-cuda-nvrtc) are not installed here")
    # (a bf16 row of 4096 in groups too: the prelude's templates compile only where a kernel uses
    # them, and NVRTC lacks builtins nvcc has, such as __builtin_memcpy)
    kernels = sources(explain(lambda x: torch.softmax(x, -1), torch.randn(9, 70)), "f32") + sources(
        explain(lambda x: torch.softmax(x, -1), torch.randn(9, 4096, dtype=torch.bfloat16)), "bf16")
    source = cuda.PRELUDE + "\n".join(kernels)
    image = cuda_backend._compile_nvrtc(source, "sm_90")
    assert image[:4] == b"\x7fELF"


# ---- compiles past their time limit ---------------------------------------------------------------

def test_an_nvrtc_compile_past_its_limit_is_a_build_error_remembered_in_the_cache(tmp_path, monkeypatch):
    # NVVM once spun for over 10 minutes on one kernel (bench/RESULTS.md, 111th session) and
    # in-process NVRTC hung the user's program with it: now the module fails to build at the
    # limit (its kernels then run through ATen), and later processes do not wait again
    release, calls = threading.Event(), []

    def stuck(source, arch, options):
        calls.append(arch)
        release.wait(60)
        return b"\x7fELF late"

    monkeypatch.setattr(cuda_backend, "compiler_id", lambda: "nvrtc 99.0")
    monkeypatch.setattr(cuda_backend, "_compile_nvrtc", stuck)
    try:
        start = time.perf_counter()
        with pytest.raises(BuildError, match=r"did not finish compiling a CUDA module for sm_90 within 0.3 s"):
            cuda_backend.compile_module("// a module\n", "sm_90", tmp_path, timeout=0.3)
        assert time.perf_counter() - start < 10 and calls == ["sm_90"]
        (marker,) = (tmp_path / "cuda").glob("*.timeout")
        assert float(marker.read_text()) == 0.3 and marker.with_suffix(".cu").read_text() == "// a module\n"
        # the same limit or a lower one: not tried again
        for limit in (0.3, 0.1):
            with pytest.raises(BuildError, match="in an earlier run"):
                cuda_backend.compile_module("// a module\n", "sm_90", tmp_path, timeout=limit)
        assert calls == ["sm_90"]
    finally:
        release.set()
    # a higher limit tries again; a compile inside it is cached as any other
    monkeypatch.setattr(cuda_backend, "_compile_nvrtc", lambda source, arch, options: b"\x7fELF quick")
    image, cached, path = cuda_backend.compile_module("// a module\n", "sm_90", tmp_path, timeout=30)
    assert image == b"\x7fELF quick" and not cached and path.read_bytes() == image
    assert cuda_backend.compile_module("// a module\n", "sm_90", tmp_path, timeout=0.1)[1]  # from the cache

    def broken(source, arch, options):
        raise BuildError("NVRTC failed to compile for sm_90: an error")

    monkeypatch.setattr(cuda_backend, "_compile_nvrtc", broken)  # its errors come back from the thread
    with pytest.raises(BuildError, match="an error"):
        cuda_backend.compile_module("// another module\n", "sm_90", tmp_path, timeout=30)


def test_an_nvcc_compile_past_its_limit_is_stopped(tmp_path, monkeypatch):
    slow = tmp_path / "nvcc"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")  # (exec: the process killed is the sleep itself)
    slow.chmod(0o755)
    monkeypatch.setattr(cuda_backend, "compiler_id", lambda: "nvcc (a slow one)")
    monkeypatch.setattr(cuda_backend, "_nvcc", lambda: str(slow))
    start = time.perf_counter()
    with pytest.raises(BuildError, match=r"within 0.5 s .*timed out after 0.5 s; it was stopped"):
        cuda_backend.compile_module("// a module\n", "sm_90", tmp_path / "cache", timeout=0.5)
    assert time.perf_counter() - start < 20
    assert list((tmp_path / "cache" / "cuda").glob("*.timeout"))


def test_the_compile_limit_option_reaches_the_compiles_of_a_module(monkeypatch):
    seen = []

    def compile_module(source, arch, cache_dir, wide=False, timeout=None):
        seen.append((wide, timeout))
        raise BuildError("not compiled here")

    monkeypatch.setattr(cuda_backend, "compile_module", compile_module)
    cfg = ember.config.replace(cuda_compile_timeout=12.5)
    wide = cuda_backend.WideModule("// a module\n", "sm_90", ["k_i64"], cfg)
    for _ in range(2):  # (a failure is remembered: one compile)
        with pytest.raises(BuildError, match="not compiled here"):
            wide.function(0, "k_i64")
    assert seen == [(True, 12.5)]


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
def test_a_module_past_the_compile_limit_runs_through_aten_with_one_warning(tmp_path):
    # no compile finishes in 0.1 ms: the graph's one kernel falls back (built alone, it fails at
    # once, its module's timeout remembered), and the results are eager's
    x = torch.randn(1000, 3, device="cuda")
    fn = ember.compile(lambda x: x.exp() + 1,
                       options={"gpu_backend": "cuda", "cuda_compile_timeout": 1e-4, "cache_dir": tmp_path})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn(x)
    torch.testing.assert_close(out, x.exp() + 1)
    failed = [str(w.message) for w in caught if "failed to build" in str(w.message)]
    assert len(failed) == 1 and "cuda_compile_timeout" in failed[0], [str(w.message) for w in caught]
    assert list((tmp_path / "cuda").glob("*.timeout"))


@needs_nvcc
def test_a_module_past_the_compile_limit_fails_to_build_with_one_warning(kernels_of, monkeypatch, tmp_path):
    # the backend's whole build on this CPU machine (nvcc, no device: the driver is not reached
    # before the compile): the module runs out of time, its one kernel built alone fails at once
    # on the remembered timeout, one warning names the option
    (k,), _ = kernels_of(lambda x: x.exp() + 1, torch.randn(4, 5))
    monkeypatch.setattr(cuda_backend, "_nvrtc", lambda: None)  # the nvcc path, wherever NVRTC exists
    cuda_backend.compiler_id.cache_clear()
    monkeypatch.setattr(cuda_backend, "_driver", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    cfg = ember.config.replace(cuda_compile_timeout=1e-3, cache_dir=tmp_path)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            built = get_backend("cuda").build([k], cfg)
    finally:
        cuda_backend.compiler_id.cache_clear()
    failed = [str(w.message) for w in caught if "failed to build" in str(w.message)]
    assert len(failed) == 1 and "in an earlier run" in failed[0] and "cuda_compile_timeout" in failed[0], failed
    assert list(built.failed) == [k.name] and not built.functions
    assert len(list((tmp_path / "cuda").glob("*.timeout"))) == 1
