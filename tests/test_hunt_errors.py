"""Found by an error-path hunt (bad and edge-case inputs, eager's exception type against ember's):
ops over empty bool tensors that eager computes or refuses by their dtype first; scans to bools
of a tensor that requires grad; the op named in errors of functions torch wraps and of tensor
methods; nll_loss of one sample with a 1-d target; int64 aranges of float bounds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import check


def _same_error(fn, *args, expected: type[BaseException]) -> None:
    """eager raises ``expected`` (exactly), and so does ember."""
    with pytest.raises(expected) as info:
        fn(*args)
    assert type(info.value) is expected
    with pytest.raises(expected) as info:
        ember.compile(fn)(*args)
    assert type(info.value) is expected, info.value


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0)])
@pytest.mark.parametrize("dim", [0, -1])
def test_log_softmax_of_an_empty_bool_tensor_is_empty(shape, dim):
    """Eager returns an empty bool tensor (its kernel runs over no rows). The decomposition that
    Dynamo's fake tensors run subtracted bools, refused: NotImplementedError."""
    def f(x):
        return torch.log_softmax(x, dim), x.softmax(dim), x.log_softmax(dim) | True

    check(f, torch.zeros(shape, dtype=torch.bool, device=DEVICE))


def test_log_softmax_of_bools_with_elements_stays_refused():
    """(eager has no bool kernel: NotImplementedError)"""
    _same_error(lambda x: torch.log_softmax(x, -1), torch.ones(3, dtype=torch.bool, device=DEVICE),
                expected=NotImplementedError)


@pytest.mark.parametrize("dynamic", [True, None])
def test_split_of_an_empty_dim_is_one_empty_chunk(dynamic):
    """Eager returns the one empty chunk. torch 2.11's decomposition, which fake tensors run for
    a tensor of symbolic sizes, made no chunk and raised IndexError while Dynamo traced."""
    def f(x):
        return x.split(1, dim=1)[0] * 2, x.split(3, dim=-2)[-1].sum(-1), len(x.split(2, 1))

    x = torch.randn(7, 0, 5, device=DEVICE, requires_grad=True)
    check(f, x, dynamic=dynamic)
    compiled = ember.compile(f, dynamic=dynamic)
    for rows in (7, 66):  # (the second: the rows' size turned symbolic)
        x = torch.randn(rows, 0, 5, device=DEVICE, requires_grad=True)
        out = compiled(x)
        assert out[0].shape == (rows, 0, 5) and out[2] == 1
        (out[0].sum() + out[1].sum()).backward()
        assert x.grad.shape == x.shape
    with pytest.raises(RuntimeError, match="split_size"):
        ember.compile(lambda t: t.split(-1, dim=1), dynamic=dynamic)(x)
    # a 0-d tensor: eager's RuntimeError (the decomposition indexed its shape: IndexError)
    for split in (lambda t: t.split(1), lambda t: t.split([1]), lambda t: torch.split(t, [1, 0])):
        _same_error(split, torch.tensor(1.0, device=DEVICE), expected=RuntimeError)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim, keepdim", [(-2, False), ((-2, 0), False), ((-3, -2), False), (-2, True)])
def test_vector_norm_over_size_one_dims_from_the_end_has_eagers_shape(dtype, dim, keepdim):
    """torch 2.11's meta function kept a size-1 dim named from the end (its negative number
    matched no position): Dynamo traced (5, 1, 7) for eager's (5, 7), and the expand after it
    raised in ember where eager runs (or the graph ran through ATen with a warning)."""
    def f(x):
        v = torch.linalg.vector_norm(x, dim=dim, keepdim=keepdim)
        return v.exp() - 2 * v, v.expand(3, *v.shape)

    x = torch.randn(5, 1, 7, device=DEVICE, dtype=dtype, requires_grad=True)
    x = x if dim != (-3, -2) else x[:1].detach().requires_grad_(True)
    check(f, x)


@pytest.mark.parametrize("fn", [lambda x: x.argmax(-1), lambda x: x.argmin(), lambda x: torch.argmax(x, 0, True)],
                         ids=["argmax_dim", "argmin_all", "argmax_keepdim"])
@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 2)])
def test_argmax_of_an_empty_bool_tensor_refuses_the_dtype(fn, shape):
    """Eager's kernel refuses bools first (RuntimeError); the meta function checked the empty
    dim first, an IndexError."""
    x = torch.zeros(shape, dtype=torch.bool, device=DEVICE)
    _same_error(fn, x, expected=RuntimeError)
    with pytest.raises(RuntimeError, match="does not support bool input"):
        ember.compile(fn)(x)


@pytest.mark.parametrize("fn", [lambda x: x.cumsum(0, dtype=torch.bool),
                                lambda x: torch.cumprod(x * 2, 0, dtype=torch.bool)], ids=["cumsum", "cumprod"])
def test_a_scan_to_bools_of_a_tensor_requiring_grad_has_no_kernel(fn):
    """Eager's scan kernels have no bool version: NotImplementedError. Traced, the meta function
    computed the scan and autograd refused its bool result first, a RuntimeError."""
    x = torch.randn(4, device=DEVICE, requires_grad=True)
    _same_error(fn, x, expected=NotImplementedError)
    # (to integers eager computes, then autograd refuses the result: its RuntimeError stays)
    _same_error(lambda x: x.cumsum(0, dtype=torch.int64), x, expected=RuntimeError)


def test_an_error_of_max_pool2d_names_it():
    """F.max_pool2d is a wrapper made by torch's boolean_dispatch: its error was named
    "boolean_dispatch.<locals>.fn"."""
    x = torch.randn(1, 1, 5, 5, device=DEVICE)
    _same_error(lambda x: F.max_pool2d(x, 7), x, expected=RuntimeError)
    with pytest.raises(RuntimeError, match=r"^max_pool2d: .*Output size is too small"):
        ember.compile(lambda x: F.max_pool2d(x, 7))(x)


@pytest.mark.parametrize("loss", [F.nll_loss, F.cross_entropy], ids=["nll_loss", "cross_entropy"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_one_sample_with_a_target_of_one_element(loss, reduction):
    """Eager's kernel takes a 1-d target of one element for one sample (a 1-d input), a 0-d loss
    even unreduced; torch's decomposition, which Dynamo's fake tensors run, refused it as a
    batch of another size (RuntimeError)."""
    def f(x, t, w):
        return loss(x, t, w, reduction=reduction)

    x = torch.randn(3, device=DEVICE)
    check(f, x, torch.tensor([2], device=DEVICE), torch.rand(3, device=DEVICE))


def test_one_sample_with_a_target_of_two_elements_is_a_value_error():
    """(eager's ValueError, where the decomposition's size check raised RuntimeError)"""
    x, t = torch.randn(3, device=DEVICE), torch.tensor([1, 0], device=DEVICE)
    _same_error(F.nll_loss, x, t, expected=ValueError)
    _same_error(F.cross_entropy, x, t, expected=ValueError)


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="eager's own arange dies of SIGFPE there (torch 2.11 on the GPU machine)")
def test_an_int64_arange_whose_step_truncates_to_zero_is_a_value_error():
    """torch's reference raises eager's ValueError (torch._check_value), which was made a
    RuntimeError as a Python number's conversion failing would be. On CPU tensors only: the
    check is the trace's, whatever the device. Under torch 2.11 eager's arange itself divides by
    the zero step (SIGFPE); ember raised "integer division or modulo by zero" there."""
    _same_error(lambda x: torch.arange(0, 1, 0.3, dtype=torch.int64) + x, torch.ones(1, dtype=torch.int64),
                expected=ValueError)


@pytest.mark.parametrize("args", [(2.5,), (-3, 2.2), (1, 7.9, 2)], ids=["end", "start_end", "step"])
def test_an_int64_arange_to_a_float_end_compiles(args):
    """Its int64 count check read the float end as None: a TypeError, and the graph ran
    through ATen."""
    check(lambda x: torch.arange(*args, dtype=torch.int64, device=DEVICE) + x,
          torch.zeros((), dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("fn, op, expected", [
    (lambda x: x.view(5, 3), "view", RuntimeError),
    (lambda x: x.reshape(5, -1), "reshape", RuntimeError),
    (lambda x: x.sum(2), "sum", IndexError),
    (lambda x: x.transpose(0, 2), "transpose", IndexError),
], ids=["view", "reshape", "sum_dim", "transpose_dim"])
def test_an_error_of_a_tensor_method_names_it(fn, op, expected):
    """Errors of a tensor's methods (Dynamo's call_method nodes) came without the op's name; an
    IndexError, which Dynamo lets through unwrapped, too."""
    x = torch.randn(4, 3, device=DEVICE)
    _same_error(fn, x, expected=expected)
    with pytest.raises(expected, match=f"^{op}: "):
        ember.compile(fn)(x)
