"""Found by a differential fuzzer (random programs of pointwise ops, reductions, views and casts
against eager): the sign of a zero a float -> int -> float cast gives; outputs that view one clone
of an input a kernel also reads; an integer division summed over no elements, and over no rows
beside their row sums; argmax's reference over no rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import ember
from ember.analysis.reference import _reduce
from ember.ir.ops import Op

from .conftest import DEVICE
from .helpers import assert_same, check


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("to", [torch.int64, torch.int32])
def test_a_cast_to_integers_and_back_gives_plus_zero_as_eager(dtype, to):
    # x.long() of -0.5 is 0, and 0 as a float is +0.0: x / x.long() is -inf there. Compiled with
    # -fno-trapping-math, GCC made (float)(long)x truncf(x), -0.0, and the quotient +inf
    def f(x):
        return x / x.to(to), 1 / x.to(to).to(dtype)

    x = torch.tensor([-0.5, 0.5, -0.99, -1.5, -0.0, 0.0, 2.5, -7.0, float("nan")], dtype=dtype, device=DEVICE)
    out, ref = ember.compile(f)(x), f(x)
    assert_same(out, ref)
    for o, r in zip(out, ref):
        assert torch.equal(torch.signbit(o), torch.signbit(r))


def test_outputs_viewing_one_clone_of_an_input_that_a_kernel_reads():
    # the clone is the input in ember's IR, copied for the outputs after the kernel's step; the
    # program had deleted the input after that step already (UnboundLocalError)
    def f(x):
        y = x.clone()
        return x + 1, y[1:], y[:2]

    x = torch.randn(4, 3, device=DEVICE)
    out, ref = ember.compile(f)(x), f(x)
    assert_same(out, ref)
    assert out[1].untyped_storage().data_ptr() == out[2].untyped_storage().data_ptr()
    assert out[1].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


VIEWS_OF_ONE_RESULT = {
    # (fuzz seed 818296670125: a max_pool1d of kernel 1 is a strided slice of its input in
    # ember's IR; returned beside its .reshape(-1) in training, it came back strided, and
    # AOTAutograd's .view(-1) of it, the other output, raised where eager's result is contiguous)
    "pool_of_one": lambda x: (lambda y: (y, y.reshape(-1)))(F.max_pool1d(x, 1, stride=2)),
    "slice_clone": lambda x: (lambda y: (y, y.view(-1)))(x[..., ::2].clone()),
    "transposed_slice": lambda x: (lambda y: (y, y[:, 1:3]))(x[0].t()[1:].clone()),
    "permuted": lambda x: (lambda y: (y, y[1], y.transpose(0, 1)))(x.permute(2, 0, 1).clone()),
}


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("case", list(VIEWS_OF_ONE_RESULT))
def test_outputs_viewing_one_fresh_result_share_it_at_eagers_strides(case, train):
    # eager returns one fresh result and views of it; ember's IR made that result a view of the
    # input (a clone is its source): the copy is of the result, laid out as eager's, and the
    # other outputs are eager's views of that copy
    f = VIEWS_OF_ONE_RESULT[case]
    x = torch.randn(3, 7, 10, device=DEVICE)[..., :9]  # (not contiguous)
    out, ref = ember.compile(f)(x.requires_grad_(train)), f(x)
    assert_same(out, ref)
    assert [o.stride() for o in out] == [r.stride() for r in ref]
    with torch.no_grad():  # one memory, as eager's: a write to the last output shows in the others
        out, ref = ember.compile(f)(x.detach()), f(x.detach())
        out[-1].add_(1)
        ref[-1].add_(1)
    assert_same(out, ref)


def test_a_repeat_viewed_twice_beside_a_kernel_reading_its_input():
    def f(x):
        y = x.repeat(2, 1)
        return x * 2, y, y[:, :1]

    x = torch.randn(1, 4, device=DEVICE)
    assert_same(ember.compile(f)(x), f(x))


@pytest.mark.parametrize("shape", [(0, 3), (0,)])
def test_an_integer_division_reduced_over_no_elements_raises_no_zero_division(shape):
    # eager divides no element; the kernel computed a // b of the constants that stand for the
    # empty inputs' elements before the reduction loop that never runs, and flagged 0 // 0
    def f(a, b, c):
        return torch.div(a, b, rounding_mode="floor").sum(0) + c, torch.remainder(a, b).prod(0) * c

    a = torch.zeros(shape, dtype=torch.int64, device=DEVICE)
    c = torch.arange(3, device=DEVICE) if len(shape) > 1 else torch.tensor(5, device=DEVICE)
    out, ref = ember.compile(f)(a, a.clone(), c), f(a, a.clone(), c)
    assert_same(out, ref)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0, 3)])
def test_a_reduction_over_no_rows_beside_their_row_sums(shape):
    # the scalar sum joined the row kernel of a.sum(-1) to reduce across its rows; the rows' roots,
    # all empty, were left out, and the kernel without inner loops had no accumulator for it:
    # C++ that did not compile (its graph ran through ATen), beside a hoisted 0 // 0
    def f(a, b):
        col = (..., 0)
        return (a.sum(-1), (a[col] // b[col]).sum(), torch.remainder(a[col], b[col]).prod(),
                (a[col] // b[col] > 0).any(), a[col].float().mean())

    a = torch.zeros(shape, dtype=torch.int64, device=DEVICE)
    check(f, a, a.clone())


def test_argmin_reference_over_no_kept_elements():
    # the reference (constant folding, a kernel's ATen fallback) flattened the reduced dims to
    # -1, ambiguous where a kept dim is 0
    x = torch.randn(4, 0)
    assert _reduce(Op.ARGMIN, x, (0,)).shape == (1, 0)
    y = torch.randn(3, 4, 5)
    assert torch.equal(_reduce(Op.ARGMAX, y, (0, 2)).flatten(),
                       y.permute(1, 0, 2).reshape(4, -1).argmax(-1))
