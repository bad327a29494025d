"""Average pooling (1-d, 2-d, 3-d) generated as one pointwise kernel, against eager: values over
dtypes and layouts (eager's result strides), count_include_pad, ceil_mode and divisor_override,
gradients, fusion with the op before it, symbolic sizes, eager's errors, and the inputs that stay
with ATen's kernel. Padded windows, and the backwards of overlapping windows, are decomposed on
GPUs only (frontend/pool_decomps.py); the ``padded_on_cpu`` fixture (conftest.py) turns them on
for CPU tensors, so their values are checked here too."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import ember

from .conftest import DEVICE, INTERPRETED_TRITON
from .helpers import assert_same, check, run
from .test_cuda import needs_nvcc
from .test_max_pool import FLOATS, _layouts, check_backward, check_cuda_sources, check_gradients, check_opinfo_samples

# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override) over (2, 3, 7, 9)
CONFIGS_2D = [
    (3, 2, 1, False, True, None),
    (3, 2, 1, True, False, None),
    ((2, 3), (3, 2), (1, 1), True, True, None),   # (ceil_mode's last windows reach past the padding)
    ((5, 4), (3, 2), 2, True, False, None),
    (3, 1, 1, False, False, 5),
    (2, None, 0, False, True, None),
    ((5, 5), 1, 0, False, True, None),            # (25 positions: the most unrolled)
    (1, 1, 0, False, True, None),
]


def _pool_all(configs):
    return lambda *xs: [F.avg_pool2d(x, *config) for x in xs for config in configs]


def _check_layouts(fn, xs):
    # (one compile of the inputs as they are: check() would clone the strided one contiguous)
    ref = fn(*xs)
    got, report = run(fn, *xs)
    assert_same(got, ref)
    assert not report.fallbacks, report.fallbacks
    assert [t.stride() for t in got] == [t.stride() for t in ref]  # (channels_last in, channels_last out)


def test_avg_pool2d_matches_eager_over_layouts(padded_on_cpu):
    # contiguous, channels_last, strided, unbatched and H/W-swapped inputs, each pooled every way
    _check_layouts(_pool_all(CONFIGS_2D), _layouts(torch.float32))


@pytest.mark.parametrize("dtype", FLOATS[1:], ids=str)
def test_avg_pool2d_of_other_dtypes_matches_eager(dtype, padded_on_cpu):
    # (16-bit inputs are summed in float and rounded once, as eager's kernels do)
    _check_layouts(_pool_all(CONFIGS_2D[:4]), _layouts(dtype)[:2])


def test_avg_pool_sums_from_plus_zero_and_propagates_nan_and_inf(padded_on_cpu):
    x = torch.full((1, 2, 4, 4), -0.0, device=DEVICE)
    x[0, 1, 0, 0], x[0, 1, 3, 3], x[0, 1, 2, 0] = float("nan"), float("inf"), -float("inf")
    fn = lambda x: [F.avg_pool2d(x, 2), F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)]  # noqa: E731
    got, ref = ember.compile(fn)(x), fn(x)
    assert_same(got, ref)
    # a window of -0.0 averages to 0.0, as eager's sum starts from 0
    assert [torch.signbit(t).any().item() for t in got] == [torch.signbit(t).any().item() for t in ref]


def test_avg_pool2d_fuses_with_its_input_in_one_kernel():
    x = torch.randn(2, 8, 12, 10)
    report = check(lambda x: F.avg_pool2d(torch.relu(x) * 2, 2), x)
    assert not report.fallbacks, report.fallbacks
    (kernel,) = report.kernels
    assert "avg_pool2d" in kernel.name and "relu" in kernel.name, kernel.name
    assert kernel.source.count("arg0_1[") == 4 and "/ v" in kernel.source, kernel.source  # one sum, one division


def test_padded_avg_pool_on_the_cpu_and_other_inputs_keep_atens_kernel():
    x = torch.randn(2, 3, 6, 6)
    for fn, arg in [(lambda x: F.avg_pool2d(x, 3, 2, 1), x),
                    (lambda x: F.avg_pool2d(x, 2, ceil_mode=True), x),
                    (lambda x: F.avg_pool2d(x, 6), x),                          # (36 positions)
                    (lambda x: F.avg_pool2d(x, 2), torch.randint(-9, 9, (2, 3, 6, 6))),
                    (lambda x: F.avg_pool2d(x, 2), torch.randn(0, 3, 6, 6))]:
        report = check(fn, arg)
        assert any("avg_pool2d" in call for call in report.fallbacks), report.fallbacks


def test_avg_pool_1d_and_3d_match_eager(padded_on_cpu):
    x3 = torch.randn(2, 3, 5, 6, 7)
    fn = lambda x1, *x3s: [  # noqa: E731
        F.avg_pool1d(x1, 3, 2, 1), F.avg_pool1d(x1[0], 2, ceil_mode=True, count_include_pad=False),
        *[F.avg_pool3d(x, (3, 2, 3), 2, 1) for x in x3s],
        *[F.avg_pool3d(x, 2, (1, 2, 2), (1, 1, 0), True, False) for x in x3s],
        *[F.avg_pool3d(x, (2, 1, 2), divisor_override=3) for x in x3s]]
    args = (torch.randn(2, 3, 11), x3, x3.to(memory_format=torch.channels_last_3d), x3[0])
    report = check(fn, *args)
    assert not report.fallbacks, report.fallbacks
    assert [t.stride() for t in ember.compile(fn)(*args)] == [t.stride() for t in fn(*args)]


def test_avg_pool_of_one_channel_has_eagers_strides(padded_on_cpu):
    # a channels_last(_3d) input of one channel: avg_pool3d's result is eager's contiguous one,
    # strides of the size-1 channel dim included (.contiguous() kept the pooled (8, 1, 4, 2, 1))
    fn = lambda x3, x2: [F.avg_pool3d(x3, 2), F.avg_pool3d(x3, 2, 2, 1), F.max_pool3d(x3, 2),  # noqa: E731
                         F.avg_pool2d(x2, 2), F.max_pool2d(x2, 2, return_indices=True)]
    args = (torch.randn(2, 1, 4, 4, 4, device=DEVICE).to(memory_format=torch.channels_last_3d),
            torch.randn(2, 1, 4, 6, device=DEVICE).to(memory_format=torch.channels_last))
    check(fn, *args)
    got, ref = ember.compile(fn)(*args), fn(*args)
    assert [t.stride() for t in got[:4]] == [t.stride() for t in ref[:4]]
    assert [t.stride() for t in got[4]] == [t.stride() for t in ref[4]]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_avg_pool_gradients_match_eager(memory_format, padded_on_cpu):
    def fn(x, w):
        y = F.avg_pool2d(torch.relu(x), 3, 1, 1, count_include_pad=False) * w
        return F.avg_pool2d(y, 2, ceil_mode=True) + F.avg_pool1d(x.flatten(2), 4, 3).sum()
    check_gradients(fn, memory_format)


def test_avg_pool_of_changing_sizes_compiles_once():
    fn = lambda x: F.avg_pool2d(torch.relu(x), 3, 1)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    before = ember.stats()["graphs_compiled"]
    for shape in [(2, 3, 9, 8), (3, 4, 5, 11), (4, 2, 6, 5), (2, 3, 16, 17)]:
        x = torch.randn(shape)
        assert_same(compiled(x), fn(x))
    assert ember.stats()["graphs_compiled"] - before == 1


@pytest.mark.parametrize("args", [(0,), (2, 0), (2, 2, 2), (9,), (2, 2, 0, False, True, 0)],
                         ids=["kernel 0", "stride 0", "pad 2 of 2", "too small", "divisor 0"])
def test_avg_pool_arguments_eager_refuses_raise_its_error(args):
    fn = lambda x: F.avg_pool2d(x, *args)  # noqa: E731
    x = torch.randn(2, 3, 7, 8)
    with pytest.raises(RuntimeError) as eager:
        fn(x)
    with pytest.raises(RuntimeError) as compiled:
        ember.compile(fn)(x)
    with pytest.raises(RuntimeError) as upstream:  # (Dynamo's fake tensors run the meta function first:
        torch.compile(fn, backend="aot_eager")(x)  # torch 2.11's checks the stride before the kernel)
    said = str(compiled.value).splitlines()[0].split(": ", 1)[-1]
    assert str(eager.value).splitlines()[0] in str(compiled.value) or said in str(upstream.value), (
        str(eager.value), str(upstream.value), str(compiled.value))


_OPINFO = [op for op in op_db if op.name in ("nn.functional.avg_pool1d", "nn.functional.avg_pool2d",
                                              "nn.functional.avg_pool3d")]


@pytest.mark.parametrize("op", _OPINFO, ids=lambda op: op.name)
def test_avg_pool_opinfo_samples_match_eager(op, padded_on_cpu):
    assert check_opinfo_samples(op).kernels


@INTERPRETED_TRITON
def test_avg_pool_on_triton_matches_eager(padded_on_cpu):
    x = torch.randn(2, 3, 7, 9)
    fn = lambda x: [F.avg_pool2d(torch.relu(x), 3, 2, 1),  # noqa: E731
                    F.avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)]
    report = check(fn, x, options={"target": "triton"})
    assert not report.fallbacks, report.fallbacks


@needs_nvcc
def test_avg_pool_cuda_kernels_compile_for_sm90(tmp_path, padded_on_cpu):
    fn = lambda x, y: [F.avg_pool2d(torch.relu(x), 3, 2, 1),  # noqa: E731
                       F.avg_pool2d(y, 2, ceil_mode=True, count_include_pad=False)]
    check_cuda_sources(fn, "avg_pool2d", tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tiled_avg_pool_backward_is_generated_and_matches_eager(dtype, padded_on_cpu):
    # windows that tile the input: each input position gets its window's gradient over the
    # divisor, in one kernel; rows past the last whole window (9 = 4 * 2 + 1) get none; eager
    # adds to zeros, so -0.0 becomes 0.0
    def fn(x):
        return [F.avg_pool2d(torch.relu(x) * 2, 2), F.avg_pool2d(x, (2, 3), divisor_override=4),
                F.avg_pool2d(x[..., :8, :], 2, ceil_mode=True, count_include_pad=False)]  # (sizes that divide)

    check_backward(fn, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_overlapping_avg_pool_backward_is_generated_and_matches_eager(dtype, padded_on_cpu):
    # each input position sums the shares of the windows holding it, each over eager's divisor:
    # padding (counted or not), ceil_mode's partial windows, divisor_override, 1-d and 3-d
    def fn(x):
        pools = [F.avg_pool2d(torch.relu(x) * 2, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)]
        if x.shape[0] != 2 or not x.is_contiguous():  # (other layouts: two cases, for the compile's time)
            return pools
        return [*pools, F.avg_pool2d(x, (3, 2), 2, (1, 0), ceil_mode=True),
                F.avg_pool2d(x, (2, 3), (1, 2), 1, True, False), F.avg_pool2d(x, 3, 2, 1, divisor_override=5),
                F.avg_pool1d(x.flatten(-2), 4, 3, 2, ceil_mode=True, count_include_pad=False),
                *([F.avg_pool3d(x.unsqueeze(-4), (2, 3, 3), (1, 2, 2), 1, True, False)]
                  if dtype != torch.bfloat16 else [])]  # (eager's CPU kernel has no 16-bit avg_pool3d)
    check_backward(fn, dtype)
