"""Outputs laid out as eager lays them out: the strides a user sees (``.view`` raises on the
wrong ones, ``is_contiguous`` answers otherwise), with the values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check


def _dims_strides(t: torch.Tensor) -> list[int]:
    """Strides of the dims that have them (a dim of size 1 may have any)."""
    return [st for st, n in zip(t.stride(), t.shape) if n != 1]


_W = torch.randn(3, 3, 2, 2)
_CL = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("fn, x", [
    (lambda x: F.conv2d(x, _W).contiguous(), _CL),
    (lambda x: F.max_pool2d(x, 2).contiguous(), _CL),
    (lambda x: F.conv2d(F.conv2d(x, _W).contiguous(), _W), _CL),
    (lambda x: F.conv2d(x, _W).clone(memory_format=torch.channels_last), torch.randn(2, 3, 6, 6)),
    (lambda x: (x @ x).t().contiguous(), torch.randn(4, 4)),
], ids=["conv_contiguous", "pool_contiguous", "conv_of_contiguous", "conv_clone_channels_last", "mm_t_contiguous"])
def test_a_layout_change_of_an_aten_result_is_kept(fn, x):
    # a clone or .contiguous() is no op in ember's IR: the ATen result came back as ATen laid it
    # out (channels_last after .contiguous(), whose .view(n, -1) then raised where eager's did not)
    want, got = fn(x), ember.compile(fn)(x)
    assert_same(got, want)
    assert _dims_strides(got) == _dims_strides(want)


@pytest.mark.parametrize("fn, x", [
    (lambda x: (x * 2).unsqueeze(0).expand(3, 4, 6), torch.randn(6, 4).t()),
    (lambda x: (x * 2)[:1].expand(4, 3, 4, 5), torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)),
    (lambda x: (lambda y: (y[0], y.unsqueeze(0).expand(2, 4, 6)))(x * 2), torch.randn(6, 4).t()),
], ids=["expand_of_transposed", "expand_of_channels_last", "two_views_of_transposed"])
def test_views_of_a_computed_value_have_its_eager_layout(fn, x):
    # the value the views are replayed from was stored row-major, where eager's follows its input
    want, got = fn(x), ember.compile(fn)(x)
    assert_same(got, want)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        assert _dims_strides(g) == _dims_strides(w)


def test_outputs_over_a_relaid_aten_result_share_its_memory():
    # y = mm(x).t().contiguous(): y and y[0] are one copy's memory in eager (a write into y
    # shows in y[0]), each with eager's strides
    def fn(x):
        y = (x @ x).t().contiguous()
        return y, y[0]
    x = torch.randn(4, 4)
    (y, row), (want_y, want_row) = ember.compile(fn)(x), fn(x)
    assert_same((y, row), (want_y, want_row))
    assert y.stride() == want_y.stride() and row.stride() == want_row.stride()
    y.zero_()
    assert row.abs().sum().item() == 0


@pytest.mark.parametrize("x", [torch.randn(2, 4, 5, 5).to(memory_format=torch.channels_last),
                               torch.randn(2, 4, 3, 5, 5).to(memory_format=torch.channels_last_3d)],
                         ids=["2d", "3d"])
def test_global_average_pooling_of_channels_last_trains_without_aten(x):
    # ATen gives the mean channels_last strides with an in-place as_strided_: traced, it and its
    # gradient (an as_strided_scatter) ran through ATen, and the result came back contiguous
    pool = F.adaptive_avg_pool2d if x.dim() == 4 else F.adaptive_avg_pool3d
    fn = lambda x: pool(x, 1)  # noqa: E731
    report = ember.Report()
    got_x, want_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = ember.compile(fn, report=report)(got_x), fn(want_x)
    grad = torch.randn_like(want)
    got.backward(grad)
    want.backward(grad)
    assert_same((got, got_x.grad), (want, want_x.grad))
    assert got.stride() == want.stride() and got_x.grad.stride() == want_x.grad.stride()
    assert report.fallbacks == []


@pytest.mark.parametrize("fn", [
    lambda x: torch.empty_like(x).fill_(1) * x,
    lambda x: F.channel_shuffle(x * 2, 3),
], ids=["empty_like", "channel_shuffle"])
def test_ops_over_channels_last_keep_eager_layout_without_aten(fn):
    # empty_like of a channels_last tensor is an empty_permuted in the trace, which ran through
    # ATen; torch's channel_shuffle decomposition returned a contiguous result (eager's keeps the
    # input's format)
    report = ember.Report()
    x = _CL.clone().requires_grad_()  # (a training graph: an inference one folded the empty away)
    got, want = ember.compile(fn, report=report)(x), fn(x)
    assert_same(got, want)
    assert got.stride() == want.stride()
    assert report.fallbacks == []


_ROWS = torch.randn(6, 40)      # row-major
_COLS = torch.randn(40, 6).t()  # the same shape, column-major


@pytest.mark.parametrize("fn, a, b", [
    (torch.copysign, _ROWS, _COLS),
    (torch.copysign, _COLS, _ROWS),
    (lambda a, b: torch.copysign(a, b) * 2, _ROWS, _COLS),
    (lambda a, b: torch.copysign(a, b).t(), _ROWS, _COLS),
    (lambda a, b: torch.xlogy(a.abs(), b.abs()), _ROWS, _COLS),
    (torch.floor_divide, _ROWS, _COLS),
    (lambda a, b: torch.ops.aten.hardtanh_backward(a, b, -0.5, 0.5), _ROWS, _COLS),
], ids=["copysign", "copysign_ba", "copysign_then_mul", "copysign_t", "xlogy", "floor_divide", "hardtanh_backward"])
def test_pointwise_results_are_laid_out_as_eager_does(fn, a, b):
    # eager lays a pointwise result out after its operands, the first deciding a tie; these ops'
    # fake tensors (Python decompositions: where over the second operand) followed the second
    expected = fn(a, b)
    got = ember.compile(fn)(a, b)
    assert_same(got, expected)
    assert _dims_strides(got) == _dims_strides(expected)


@pytest.mark.parametrize("fn", [
    torch.angle,
    lambda z: torch.angle(z) * 2,
    lambda z: (torch.angle(z), z.abs()),
    lambda z: torch.stft(z.real.flatten(1), 16, hop_length=4, window=torch.hann_window(16),
                         return_complex=True).angle(),
], ids=["angle", "angle_then_mul", "angle_beside_abs", "stft_phase"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_angle_of_a_transposed_complex_tensor_is_contiguous_as_eager(fn, dynamic):
    # eager's complex angle resizes an empty result (contiguous); torch's meta lays it out like z
    # (a spectrogram's phase: stft returns frequency-major frames, transposed)
    z = torch.randn(2, 6, 5, dtype=torch.complex64).transpose(1, 2)
    expected = fn(z)
    got = ember.compile(fn, dynamic=dynamic)(z)
    assert_same(got, expected)
    for g, e in zip(got if isinstance(got, tuple) else [got], expected if isinstance(expected, tuple) else [expected]):
        assert _dims_strides(g) == _dims_strides(e)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("shape, memory_format", [((2, 8, 5, 6), torch.channels_last),
                                                  ((2, 3, 4, 5, 6), torch.channels_last_3d)],
                         ids=["channels_last", "channels_last_3d"])
def test_pointwise_kernels_walk_their_outputs_memory_in_order(shape, memory_format, dynamic):
    # the loops walked the logical dims: a channels_last relu stepped by C from one iteration to
    # the next (10x as long as over a contiguous tensor on the CPU); now one loop over memory
    x = torch.randn(shape).to(memory_format=memory_format)
    report = ember.Report()
    got = ember.compile(lambda x: torch.relu(x) * 2, report=report, dynamic=dynamic)(x)
    assert_same(got, torch.relu(x) * 2)
    assert _dims_strides(got) == _dims_strides(x)
    (kernel,) = report.kernels
    loops = kernel.source.split("// outer [")[1].split("]")[0]
    assert ", " not in loops and "buf0[o0] = " in kernel.source, kernel.source[:600]


def _conv_bn_relu_block(x, w, scale, shift, y):
    # (eval-mode batch norm's affine, relu and the residual: one kernel between two convolutions)
    h = torch.relu(F.conv2d(x, w, padding=1) * scale[:, None, None] + shift[:, None, None]) + x
    return F.conv2d(h, w, padding=1) if y is None else F.cross_entropy(F.conv2d(h, w, padding=1).mean((2, 3)), y)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_channels_last_convolution_results_are_read_where_aten_wrote_them(train, dynamic):
    # A channels_last convolution's result (and its backward's gradients) went through a
    # contiguous copy for the kernels, which then read it transposed and stored channels_last:
    # a ResNet-18's eval forward on the CPU took 2.3x its time. The kernels now read it as eager
    # lays it out, and write over it where it dies.
    cl = torch.channels_last
    w = torch.randn(6, 6, 3, 3).to(memory_format=cl)
    scale, shift = torch.rand(6) + 0.5, torch.randn(6)
    report = ember.Report()
    compiled = ember.compile(_conv_bn_relu_block, report=report, dynamic=dynamic)
    for n in (2, 3):
        x = torch.randn(n, 6, 7, 5).to(memory_format=cl)
        y = torch.randint(0, 6, (n,)) if train else None
        args = [x, w, scale, shift]
        theirs = [a.clone().requires_grad_(train) for a in args]
        ours = [a.clone().requires_grad_(train) for a in args]
        want, got = _conv_bn_relu_block(*theirs, y), compiled(*ours, y)
        assert_same(got, want)
        assert _dims_strides(got) == _dims_strides(want)
        if train:
            want_grads = torch.autograd.grad(want, theirs)
            got_grads = torch.autograd.grad(got, ours)
            for a, b in zip(got_grads, want_grads):
                assert_same(a, b)
                assert _dims_strides(a) == _dims_strides(b)
    wrappers = "\n".join(g.wrapper for g in report.graphs)
    assert "kernels read it as eager lays it out" in wrappers
    assert ".contiguous()  # kernels read it densely" not in wrappers, wrappers


@torch.library.custom_op("ember_test::scaled_but_contiguous", mutates_args=())
def _scaled_but_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous() * 2  # (its fake says channels_last, as eager's layout rule would)


@_scaled_but_contiguous.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_aten_result_laid_out_otherwise_than_traced_is_copied_for_the_kernels():
    # the kernels read a channels_last result as the trace laid it out: where the op returns
    # another layout, the program copies it into the traced one first
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    fn = lambda x: torch.ops.ember_test.scaled_but_contiguous(x) + 1  # noqa: E731
    assert_same(ember.compile(fn)(x), x * 2 + 1)


@torch.library.custom_op("ember_test::flat_cumsum", mutates_args=())
def _flat_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.view(-1).cumsum(0).view(x.shape)  # (a kernel written for contiguous input)


@_flat_cumsum.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.parametrize("read_by_a_kernel", [False, True], ids=["alone", "read_by_a_kernel"])
@pytest.mark.parametrize("use", ["as_strided", "view_as_complex", "dtype_view", "custom_op"])
def test_contiguous_of_a_channels_last_aten_result_reaches_the_next_aten_call(use, read_by_a_kernel):
    # .contiguous() is no op in ember's IR: a channels_last convolution's result went as it was
    # into an op that needs eager's contiguous layout (wrong values from as_strided; errors from
    # view_as_complex, a dtype view, a custom kernel's x.view(-1)). It is copied for such calls.
    uses = {"as_strided": lambda y: y.as_strided((2, 4), (1, 2)), "view_as_complex": torch.view_as_complex,
            "dtype_view": lambda y: y.view(torch.int16), "custom_op": torch.ops.ember_test.flat_cumsum}

    def fn(x, w):
        y = F.conv2d(x, w)
        out = uses[use](y.contiguous())
        return (y + 1, out) if read_by_a_kernel else out

    x = torch.randn(1, 2, 3, 2).to(memory_format=torch.channels_last)
    w = torch.randn(2, 2, 1, 1)
    assert_same(ember.compile(fn)(x, w), fn(x, w))


@pytest.mark.parametrize("dynamic", [False, True])
def test_buffers_between_kernels_and_views_of_them_for_aten(dynamic):
    """A channels_last activation's pointwise results: the one only kernels read follows its
    operand's layout (schedule/buffer_layouts.py); the one an ATen call reads through a reshape
    stays contiguous, the layout the view is replayed from (a reshape of a channels_last buffer
    is no view)."""
    x = torch.randn(4, 8, 6, 5).to(memory_format=torch.channels_last)
    w = torch.randn(8 * 6 * 5, 7)

    def f(x, w):
        u = torch.relu(x) * 2 + x - 1
        z = (u * u).sum((0, 2, 3)) + u.amax((0, 2, 3))
        return torch.mm(u.reshape(4, -1), w), z, u.exp()

    check(f, x, w, dynamic=dynamic)
