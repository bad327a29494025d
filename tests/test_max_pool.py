"""Max pooling (1-d, 2-d, 3-d, with and without indices) generated as one pointwise kernel, against
eager: values, indices (eager's at ties, NaN and windows of -inf), gradients, fusion with the op
before it, symbolic sizes, and the inputs that stay with ATen's kernel.

Padded windows, and the backwards of overlapping windows, are decomposed on GPUs only
(frontend/pool_decomps.py); the ``padded_on_cpu`` fixture (conftest.py) turns them on for CPU
tensors, so their values are checked here too."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import ember
from ember.codegen.cpp_prelude import PRELUDE
from ember.config import Config
from ember.runtime.cpp_build import find_compiler

from .conftest import DEVICE, INTERPRETED_TRITON
from .helpers import assert_same, check, flat_samples, program_of_samples, run
from .test_cuda import compile_batches, needs_nvcc, sources
from .test_cuda import explain as cuda_explain

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


# (kernel, stride, padding, dilation, ceil_mode) over (N, C, H, W) = (2, 3, 7, 9)
CONFIGS_2D = [
    (3, 2, 1, 1, False),
    ((3, 2), 2, (1, 0), 1, True),
    ((2, 3), (3, 2), 1, (3, 2), True),
    ((5, 4), (3, 2), 2, 1, True),
    ((5, 5), (2, 3), (2, 2), 1, False),  # (25 positions: the most unrolled)
    (2, None, 0, 1, False),
    (3, 1, 1, 1, False),
    (1, 1, 0, 1, False),
]


def _layouts(dtype):
    x = torch.randn(2, 3, 7, 9, dtype=dtype, device=DEVICE)
    strided = torch.randn(2, 7, 6, 9, dtype=dtype, device=DEVICE).transpose(1, 2)[:, ::2]
    # (H and W swapped: a pointwise result would take that order; eager's is contiguous)
    swapped = torch.randn(2, 3, 9, 7, dtype=dtype, device=DEVICE).transpose(2, 3)
    return [x, x.to(memory_format=torch.channels_last), strided, x[0], swapped]


def _pool_all(configs):
    return lambda *xs: [F.max_pool2d(x, *config, return_indices=True) for x in xs for config in configs]


def _check_layouts(fn, xs):
    ref = fn(*xs)
    got, report = run(fn, *xs)
    assert_same(got, ref)
    assert not report.fallbacks, report.fallbacks
    # (the results' strides are eager's: channels_last in, channels_last out)
    assert [t.stride() for pair in got for t in pair] == [t.stride() for pair in ref for t in pair]


def test_max_pool2d_values_and_indices_match_eager(padded_on_cpu):
    # contiguous, channels_last, strided and unbatched inputs, each pooled every way
    _check_layouts(_pool_all(CONFIGS_2D[:5]), _layouts(torch.float32))


@pytest.mark.parametrize("dtype", FLOATS[1:], ids=str)
def test_max_pool2d_of_other_dtypes_matches_eager(dtype, padded_on_cpu):
    _check_layouts(_pool_all(CONFIGS_2D[:3]), _layouts(dtype)[:2])


def test_max_pool2d_indices_at_ties_nan_and_minus_infinity_are_eagers(padded_on_cpu):
    # ties: the window's first maximum; NaN: its last NaN (eager's kernels replace the maximum by
    # every NaN); a window of -inf: its first position inside the input, never padding
    ties = torch.ones(1, 2, 5, 5)
    nans = torch.randn(2, 3, 6, 7)
    nans[0, 0, 1, 1] = nans[0, 0, 1, 2] = nans[1, 2, 4, 4] = float("nan")
    minus_inf = torch.full((1, 2, 9, 9), -float("inf"))
    minus_inf[0, 1, 4, 4] = 1.0
    cases = [(0, (3, 1, 1)), (1, (3, 1, 1)), (1, (2, 2, 1, 1, True)), (2, (3, 2, 1)),
             (2, ((3, 3), (2, 2), (1, 1), (3, 2), True)), (1, (2,)), (2, (3,))]
    fn = lambda *xs: [F.max_pool2d(xs[k], *args, return_indices=True) for k, args in cases]  # noqa: E731
    report = check(fn, ties, nans, minus_inf)
    assert not report.fallbacks, report.fallbacks


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_max_pool2d_fuses_with_its_input_in_one_kernel(memory_format):
    x = torch.randn(2, 8, 12, 10).contiguous(memory_format=memory_format)
    report = check(lambda x: F.max_pool2d(torch.relu(x) * 2, 3, 2), x)
    assert not report.fallbacks, report.fallbacks
    (kernel,) = report.kernels
    assert "max_pool2d" in kernel.name and "relu" in kernel.name, kernel.name
    # its loops in the output's memory order: channels innermost for channels_last (8 of them)
    innermost = kernel.source.split("outer [")[1].split("]")[0].split(", ")[-1]
    assert innermost == ("8" if memory_format == torch.channels_last else "4"), kernel.source[:300]


def _gcc() -> str | None:
    try:
        compiler = find_compiler(Config().cxx)
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except Exception:  # (no compiler: the CPU tests fall back, this one has nothing to ask)
        return None
    return compiler if "clang" not in version.lower() and "g++" in version + compiler else None


@pytest.mark.skipif(_gcc() is None, reason="asks GCC's vectorizer report (-fopt-info-vec)")
def test_relu_and_max_pooling_loop_vectorizes(tmp_path):
    # GCC's partial redundancy elimination wrote relu(x) != relu(x) (the max's NaN test) as
    # c ? x != x : false, a select of masks its vectorizer refuses: the loop ran one element at
    # a time, 3.8x slower. The default flags turn that pass off (-fno-tree-pre, config.py).
    x = torch.randn(2, 8, 12, 16)
    (kernel,) = check(lambda x: F.max_pool2d(torch.relu(x), 2), x).kernels
    source = PRELUDE + "\n" + kernel.source
    lines = source.splitlines()
    simd = next(i for i, line in enumerate(lines) if "#pragma omp simd" in line) + 1  # (1-based)
    path = tmp_path / "pool.cpp"
    path.write_text(source)
    proc = subprocess.run([_gcc(), *Config().cxx_flags, "-fopenmp", "-std=c++17", "-c", "-fopt-info-vec-optimized",
                           str(path), "-o", str(tmp_path / "pool.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vectorized = [int(n) for n in re.findall(r"pool\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)]
    assert any(simd < n <= len(lines) for n in vectorized), (simd, proc.stderr[-3000:])  # (in the simd loop)


def test_padded_windows_on_the_cpu_and_large_windows_keep_atens_kernel():
    # (measured slower decomposed on the CPU: each position's load is conditional there; so are
    # the backwards of overlapping windows)
    x = torch.randn(2, 8, 12, 10)
    x.requires_grad_()
    report = ember.Report()
    torch.autograd.grad(ember.compile(lambda x: F.max_pool2d(x, 3, 1), report=report)(x).sum(), x)
    assert any("max_pool2d_with_indices_backward" in call for call in report.fallbacks), report.fallbacks
    x = x.detach()
    for fn, arg in [(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1), x),
                    (lambda x: F.max_pool2d(x, 2, ceil_mode=True), x),
                    (lambda x: F.max_pool2d(x, 2, 2, 1), x.to(memory_format=torch.channels_last)),
                    (lambda x: F.max_pool2d(x, 6), x)]:  # (36 positions: more than unrolled)
        report = check(fn, arg)
        assert any("max_pool2d" in call for call in report.fallbacks), report.fallbacks


def test_max_pool_1d_and_3d_match_eager(padded_on_cpu):
    x3 = torch.randn(2, 3, 5, 6, 7)
    fn = lambda x1, *x3s: [  # noqa: E731
        F.max_pool1d(x1, 3, 2, 1, return_indices=True), F.max_pool1d(x1[0], 2, ceil_mode=True),
        F.max_pool1d(x1, 4, 1, 2, 2, return_indices=True),
        *[F.max_pool3d(x, (3, 2, 3), 2, 1, return_indices=True) for x in x3s],
        *[F.max_pool3d(x, (2, 3, 2), (1, 2, 2), (1, 1, 0), (2, 1, 1), True, True) for x in x3s]]
    report = check(fn, torch.randn(2, 3, 11), x3, x3.to(memory_format=torch.channels_last_3d), x3[0])
    assert not report.fallbacks, report.fallbacks


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_max_pool_gradients_match_eager(memory_format, padded_on_cpu):
    def fn(x, w):
        y = F.max_pool2d(torch.relu(x), 3, 1, 1) * w  # (overlapping windows share inputs)
        return F.max_pool2d(y, 2, ceil_mode=True) + F.max_pool1d(x.flatten(2), 4, 3).sum()
    check_gradients(fn, memory_format)


def check_gradients(fn, memory_format) -> None:
    """``fn(x, w)``'s result and gradients against eager's in float64, x of (2, 3, 7, 8)."""
    def grads(f):
        x = torch.randn(2, 3, 7, 8, dtype=torch.float64).contiguous(memory_format=memory_format)
        w = torch.randn(7, 8, dtype=torch.float64)
        x.requires_grad_(), w.requires_grad_()
        out = f(x, w)
        out.backward(torch.ones_like(out))
        return out, x.grad, w.grad

    torch.manual_seed(0)
    ref = grads(fn)
    torch.manual_seed(0)
    got = grads(ember.compile(fn))
    assert_same(got, ref)
    assert got[1].stride() == ref[1].stride()


def test_max_pool3d_gradient_matches_eager(padded_on_cpu):
    x = torch.randn(2, 3, 4, 6, 5, dtype=torch.float64, requires_grad=True)
    fn = lambda x: F.max_pool3d(x * x, 2, 1, 1)  # noqa: E731
    ref = torch.autograd.grad(fn(x).sum(), x)
    got = torch.autograd.grad(ember.compile(fn)(x).sum(), x)
    assert_same(got, ref)


def test_max_pool_of_changing_sizes_compiles_once():
    fn = lambda x: F.max_pool2d(torch.relu(x), 3, 1, return_indices=True)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    before = ember.stats()["graphs_compiled"]
    # (no size 1, which Dynamo specializes, nor 2: pooling's output shapes guard 3 <= H; stride 1:
    # torch 2.11's output sizes guard the parity of H - 1 under stride 2)
    for shape in [(2, 3, 9, 8), (3, 4, 5, 11), (4, 2, 6, 5), (2, 3, 16, 17)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert ember.stats()["graphs_compiled"] - before == 1


def test_max_pool_of_integers_and_empty_inputs_stays_with_aten(padded_on_cpu):
    # (eager's CPU kernel computes integers with indices; an empty batch gives empty results)
    for x in (torch.randint(-9, 9, (2, 3, 6, 6)), torch.randn(0, 3, 6, 6)):
        report = check(lambda x: F.max_pool2d(x, 2, return_indices=True), x)
        assert any("max_pool2d" in call for call in report.fallbacks), report.fallbacks


@pytest.mark.parametrize("args", [(0,), (2, 0), (2, 2, 2), (9,)],
                         ids=["kernel 0", "stride 0", "pad 2 of 2", "too small"])
def test_max_pool_arguments_eager_refuses_raise_its_error(args):
    fn = lambda x: F.max_pool2d(x, *args)  # noqa: E731
    x = torch.randn(2, 3, 7, 8)
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    with pytest.raises(RuntimeError) as compiled:
        ember.compile(fn)(x)
    assert str(eager.value).splitlines()[0] in str(compiled.value)


_OPINFO = [op for op in op_db if op.name in ("nn.functional.max_pool1d", "nn.functional.max_pool2d",
                                              "nn.functional.max_pool3d")]


@pytest.mark.parametrize("op", _OPINFO, ids=lambda op: op.name)
def test_max_pool_opinfo_samples_match_eager(op, padded_on_cpu):
    report = check_opinfo_samples(op)
    assert report.kernels  # (3-d's windows of 27 positions, and empty inputs, keep ATen's kernel)


def check_opinfo_samples(op) -> ember.Report:
    """A spread of 16 of ``op``'s OpInfo samples (hundreds, in runs of one shape), in one program."""
    samples = list(op.sample_inputs(DEVICE, torch.float32))
    samples = samples[::max(1, len(samples) // 16)][:16]
    flats = flat_samples(samples)
    fn = program_of_samples(op.op, flats, op.name)
    tensors = [flat[p] for flat, _, positions in flats for p in positions]
    return check(fn, *tensors)


@INTERPRETED_TRITON
def test_max_pool_on_triton_matches_eager(padded_on_cpu):
    x = torch.randn(2, 3, 7, 9)
    fn = lambda x: [F.max_pool2d(torch.relu(x), 3, 2, 1, return_indices=True),  # noqa: E731
                    F.max_pool2d(x, 2, ceil_mode=True, return_indices=True)]
    report = check(fn, x, options={"target": "triton"})
    assert not report.fallbacks, report.fallbacks


@needs_nvcc
def test_max_pool_cuda_kernels_compile_for_sm90(tmp_path, padded_on_cpu):
    fn = lambda x, y: [F.max_pool2d(torch.relu(x), 3, 2, 1, return_indices=True),  # noqa: E731
                       F.max_pool2d(y, 2, ceil_mode=True, return_indices=True)]
    check_cuda_sources(fn, "max_pool2d", tmp_path)


def check_cuda_sources(fn, name, tmp_path) -> None:
    """``fn(x, y)``'s CUDA kernels, of a (2, 3, 7, 9) and a channels_last one, static and dynamic
    sizes, all named for ``name`` (no ATen call), compile with nvcc for sm_90."""
    x = torch.randn(2, 3, 7, 9)
    kernels = []
    for i, dynamic in enumerate((False, True)):
        report = cuda_explain(fn, x, x.to(memory_format=torch.channels_last), dynamic=dynamic)
        assert all(name in k.name for k in report.kernels) and not report.fallbacks
        kernels += sources(report, f"d{i}")
    compile_batches(kernels, tmp_path, per_file=len(kernels))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tiled_max_pool_backward_is_generated_and_matches_eager(dtype, padded_on_cpu):
    # windows that tile the input (stride = window, no padding): each input position takes its
    # window's gradient where the index is its own, in one kernel with the op before; rows past
    # the last whole window (9 = 4 * 2 + 1) get none; eager adds to zeros, so -0.0 becomes 0.0
    def fn(x):
        return [F.max_pool2d(torch.relu(x) * 2, 2), F.max_pool3d(x.unsqueeze(1), (1, 2, 2)),
                F.max_pool2d(x[..., :8, :], (2, 3), ceil_mode=True)]  # (sizes that divide)
    check_backward(fn, dtype)


def check_backward(fn, dtype) -> None:
    """``fn``'s input gradients against eager's (values, strides, signs of zeros; one seed -0.0)
    for a (2, 3, 9, 6), an unbatched, a channels_last and a (1, 3, 9, 6) transposed input, in one
    program, with no ATen call left."""
    def grads(f, xs):
        xs = [x.detach().requires_grad_() for x in xs]
        outs = f(*xs)
        seeds = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(dtype) for i, o in enumerate(outs)]
        seeds[0].view(-1)[0] = -0.0
        return torch.autograd.grad(outs, xs, seeds)

    xs = (torch.randn(2, 3, 9, 6, dtype=dtype), torch.randn(3, 8, 6, dtype=dtype),
          torch.randn(2, 3, 8, 6, dtype=dtype).to(memory_format=torch.channels_last),
          torch.randn(1, 3, 6, 9, dtype=dtype).transpose(2, 3))
    each = lambda *xs: [out for x in xs for out in fn(x)]  # noqa: E731
    report = ember.Report()
    got, ref = grads(ember.compile(each, report=report), xs), grads(each, xs)
    assert_same(got, ref, atol=5e-2 if dtype.itemsize < 4 else None)  # (eager's CPU kernel sums in 16 bits)
    for g, r in zip(got, ref):  # (signs where eager's gradient is zero: 16-bit sums near zero may round apart)
        assert g.stride() == r.stride() and torch.equal(torch.signbit(g[r == 0]), torch.signbit(r[r == 0]))
    assert not report.fallbacks, report.fallbacks  # (no ATen backward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_overlapping_max_pool_backward_is_generated_and_matches_eager(dtype, padded_on_cpu):
    # each input position sums the gradients of the windows whose index is its own, in one
    # kernel: padding, ceil_mode's partial windows, dilation, 1-d and 3-d, windows sharing a
    # maximum (a constant input: the gradients sum), windows of -inf and NaN
    def fn(x):
        ties = torch.zeros_like(x) + 1.0  # (windows starting at -1 and 0 both pick position 0)
        edge = torch.where(x > 1.0, float("nan"), torch.where(x < 0.0, -float("inf"), x))
        pools = [F.max_pool2d(torch.relu(x) * 2, 3, 2, 1), F.max_pool2d(x, (3, 2), 2, (1, 0), ceil_mode=True)]
        if x.shape[0] != 2 or not x.is_contiguous():  # (other layouts: two cases, for the compile's time)
            return pools
        return [*pools, F.max_pool2d(x, 3, 2, 1, 2), F.max_pool1d(x.flatten(-2), 4, 3, 2, ceil_mode=True),
                F.max_pool3d(x.unsqueeze(-4), (2, 3, 3), (1, 2, 2), (1, 1, 1)),
                F.max_pool2d(ties, 2, 1, 1) * x[..., :1, :1], F.max_pool2d(edge, 3, 2, 1)]
    check_backward(fn, dtype)


def test_overlapping_pool_backwards_are_eagers_sums_bit_for_bit(padded_on_cpu):
    # eager's CPU kernel adds each window's gradient into a zero in the output's order, its CUDA
    # kernel sums the windows in that order: the same float32 sums
    x = torch.randn(2, 5, 13, 12)
    y, index = F.max_pool2d_with_indices(x, 3, 2, 1)
    grad = torch.randn_like(y) * 100
    aten = torch.ops.aten
    fn = lambda g, x, i: [  # noqa: E731
        aten.max_pool2d_with_indices_backward(g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, i),
        aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], False, False, None),
        aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], False, True, None)]
    got, report = run(fn, grad, x, index)
    assert all(torch.equal(a, b) for a, b in zip(got, fn(grad, x, index)))
    assert not report.fallbacks, report.fallbacks


@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last-bf16"])
def test_relu_and_overlapping_max_pool_backward_is_one_kernel(channels_last, padded_on_cpu):
    # (ResNet's stem: the backward's gather and relu's mask in one kernel over the input). The
    # forward saves each window's int8 position of its maximum: neither the int64 indices nor
    # the padded input, from which the backward pooled each of a position's four windows again
    report = ember.Report()
    x = torch.randn(2, 8, 13, 12)
    if channels_last:
        x = x.to(torch.bfloat16, memory_format=torch.channels_last)
    out = ember.compile(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1), report=report)(x.requires_grad_())
    torch.autograd.grad(out.sum(), x)
    assert not report.fallbacks, report.fallbacks
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    (kernel,) = backward.kernels
    assert "max_pool2d_with_indices_backward" in kernel.name and "threshold_backward" in kernel.name, kernel.name
    reads = re.findall(r"const (\w+)\* __restrict__ (\w+)", kernel.source)
    assert {t for t, name in reads if not name.startswith("tangents")} == {"bool", "int8_t"}, reads


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_overlapping_pool_backwards_find_their_windows_by_index_arithmetic(memory_format, padded_on_cpu):
    # Each candidate window is a strided view: the kernel finds it by its own index arithmetic,
    # where indexing by computed window numbers checked, wrapped and divided every candidate's
    # number as int64 values. Max pooling's backward compares the saved int8 positions with each
    # input position's place in the window (the gather that GATHERED_MAX_BACKWARD turns on)
    x = torch.randn(2, 8, 13, 12).contiguous(memory_format=memory_format)
    for pool in (lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True)):
        report = ember.Report()
        xl = x.clone().requires_grad_()
        out = ember.compile(pool, report=report)(xl)
        seed = torch.randn_like(out)
        (got,) = torch.autograd.grad(out, xl, seed)
        xr = x.clone().requires_grad_()
        (want,) = torch.autograd.grad(pool(xr), xr, seed)
        assert torch.equal(got, want) and got.stride() == want.stride()
        assert not report.fallbacks, report.fallbacks
        (backward,) = [g for g in report.graphs if g.kind == "backward"]
        (kernel,) = backward.kernels
        for value_arithmetic in ("ember_check_index", "ember_floordiv", "int64_t* __restrict__"):
            assert value_arithmetic not in kernel.source, value_arithmetic
        torch._dynamo.reset()


def test_unbatched_max_pool3d_of_a_channels_last_like_input_raises_eagers_error():
    # eager's CPU max_pool3d refuses a (C, D, H, W) input with channels_last strides; the
    # decomposition computed a result
    x = torch.randn(3, 4, 4, 5).contiguous(memory_format=torch.channels_last)
    fn = lambda x: F.max_pool3d(x, 2, return_indices=True)  # noqa: E731
    with pytest.raises(RuntimeError, match="Unsupported memory format"):
        fn(x)
    with pytest.raises(RuntimeError, match="Unsupported memory format"):
        ember.compile(fn)(x)


def test_overlapping_max_pool_backward_keeps_atens_kernel_by_default(monkeypatch):
    # (fused into a following BatchNorm backward's channel sums, the gather took seconds of a
    # ResNet-18 step on an H200: frontend/pool_decomps.py, _max_backward)
    from ember.frontend import pool_decomps
    monkeypatch.setattr(pool_decomps, "PADDED_ON_CPU", True)  # (as on a GPU)
    x = torch.randn(2, 8, 13, 12)
    for layout in (torch.contiguous_format, torch.channels_last):
        report = ember.Report()
        xl = x.contiguous(memory_format=layout).requires_grad_()
        out = ember.compile(lambda x: F.max_pool2d(x, 3, 2, 1), report=report)(xl)
        (got,) = torch.autograd.grad(out, xl, torch.ones_like(out))
        assert_same(got, torch.autograd.grad(F.max_pool2d(xl, 3, 2, 1), xl, torch.ones_like(out))[0])
        assert any("max_pool2d_with_indices_backward" in c for c in report.fallbacks), report.fallbacks
        torch._dynamo.reset()


@pytest.mark.skipif(_gcc() is None, reason="asks GCC's vectorizer report (-fopt-info-vec)")
def test_padded_windows_select_by_bits_where_the_condition_is_the_same_along_the_loop(tmp_path, padded_on_cpu):
    # channels_last bfloat16 with padding: each window's `inside ? relu(x) : -inf` has a condition
    # the same along the channels' simd loop. Three such float selects left the loop scalar
    # under GCC 12 ("unsupported data-type float", 13x the time); as selects of bits it vectorizes
    x = (torch.randn(2, 16, 9, 11) * 3).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x[0, 3, 4, 5] = float("nan")
    (kernel,) = check(lambda x: F.max_pool2d(torch.relu(x), 3, 2, 1), x).kernels
    assert "ember_pick_bits(" in kernel.source, kernel.source
    source = PRELUDE + "\n" + kernel.source
    path = tmp_path / "pool.cpp"
    path.write_text(source)
    proc = subprocess.run([_gcc(), *Config().cxx_flags, "-fopenmp", "-std=c++17", "-c", "-fopt-info-vec-optimized",
                           str(path), "-o", str(tmp_path / "pool.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = PRELUDE.count("\n") + 1
    vectorized = [int(n) for n in re.findall(r"pool\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)]
    assert any(n > first for n in vectorized), proc.stderr[-3000:]
