"""Bad input raises the exception type eager raises: integers or bools where an op takes floats,
scalars out of the dtype's range, index checks of several ops in one kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import check

inf = float("inf")
_INTS = torch.tensor([-3, 0, 2, 5], dtype=torch.int32)
_BOOLS = torch.tensor([True, False, True, True])


def _same_error(fn, *args, expected: type[BaseException]) -> None:
    """eager raises ``expected`` (exactly), and so does ember."""
    def fresh():
        return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]

    with pytest.raises(expected) as info:
        fn(*fresh())
    assert type(info.value) is expected
    with pytest.raises(expected) as info:
        ember.compile(fn)(*fresh())
    assert type(info.value) is expected, info.value


@pytest.mark.parametrize("fn, x", [
    (lambda x: F.hardtanh(x, -inf, inf), _INTS),
    (lambda x: F.hardtanh(x, -inf, 1.0), _INTS.to(torch.uint8)),
    (lambda x: F.hardtanh(x.clone(), -inf, inf, inplace=True), _INTS.long()),
], ids=["int32", "uint8_lower_only", "int64_in_place"])
def test_an_infinite_bound_of_integers_is_eagers_runtime_error(fn, x):
    # hardtanh's reference converts its bounds with int(): an OverflowError while tracing
    _same_error(fn, x, expected=RuntimeError)


@pytest.mark.parametrize("fn", [
    lambda x: F.softplus(x, beta=0.5), lambda x: F.softplus(x, beta=inf), lambda x: F.celu(x, 2.0),
], ids=["softplus_beta", "softplus_beta_inf", "celu_alpha"])
@pytest.mark.parametrize("x", [_INTS, _BOOLS], ids=["int32", "bool"])
def test_float_parameters_of_integer_activations_raise_not_implemented(fn, x):
    # the references refuse a float beta or alpha for an integer dtype with a ValueError (which
    # became a RuntimeError); eager has no kernel for the dtype
    _same_error(fn, x, expected=NotImplementedError)


_LAST_BAD, _FIRST_BAD = torch.tensor([0, 1, 2, 9]), torch.tensor([7, 0, 0, 0])


@pytest.mark.parametrize("fn, i, j, expected", [
    (lambda x, i, j: (x[i], x.gather(0, i)), _LAST_BAD, None, IndexError),
    (lambda x, i, j: x[i] * 2 + x.gather(0, i), _LAST_BAD, None, IndexError),
    (lambda x, i, j: (x.add_(1), x[i], x.gather(0, i))[1:], _LAST_BAD, None, IndexError),
    (lambda x, i, j: (x[i], x.gather(0, j)), _LAST_BAD, _FIRST_BAD, IndexError),
    (lambda x, i, j: (x.index_select(0, i), x.gather(0, j)), _LAST_BAD, _FIRST_BAD, IndexError),
    (lambda x, i, j: (x.gather(0, i), x[j]), _LAST_BAD, _FIRST_BAD, RuntimeError),
], ids=["index_then_gather", "fused_sum", "after_a_write", "bad_at_another_element", "index_select_then_gather",
        "gather_then_index"])
def test_the_first_op_with_a_bad_index_raises(fn, i, j, expected):
    # one kernel checks both ops' indices: it kept the check that failed first in its loop
    # (gather's RuntimeError: checked before the negative-index wrap x[i] needs, or at an
    # earlier element), where eager raises at the first op in the program that fails
    _same_error(fn, torch.arange(4.0), i, j, expected=expected)


@pytest.mark.parametrize("fn, args", [
    (lambda a, b: F.mse_loss(a, b), (_INTS, _INTS)),
    (lambda a, b: F.mse_loss(a, b, reduction="sum"), (_INTS, _INTS)),
    (lambda a, b: F.mse_loss(a, b, reduction="none"), (_BOOLS, _BOOLS)),
    (lambda a, b: F.binary_cross_entropy_with_logits(a, b), (_INTS, _INTS)),
    (lambda a, b: F.binary_cross_entropy(a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: F.smooth_l1_loss(a, b), (_BOOLS, _BOOLS)),
    (lambda a, b: F.huber_loss(a, b, reduction="sum"), (_BOOLS, _BOOLS)),
    (lambda a, b: F.log_softmax(a, 0), (_BOOLS, None)),
], ids=["mse_ints", "mse_ints_sum", "mse_bools", "bce_with_logits_ints", "bce_bools", "smooth_l1_bools",
        "huber_bools", "log_softmax_bools"])
def test_losses_of_integers_raise_not_implemented(fn, args):
    # their references fail inside (a mean of integers, bools subtracted or negated) with a
    # RuntimeError, or computed (an integer mse_loss summed); eager has no kernel for the dtype
    _same_error(fn, *args, expected=NotImplementedError)


@pytest.mark.parametrize("fn, x, expected", [
    (lambda x: F.unfold(x, 2), torch.ones(1, 1, 3, 3, dtype=torch.int64), NotImplementedError),
    (lambda x: F.pad(x, (1, 1), mode="reflect"), torch.ones(1, 1, 4, dtype=torch.bool), NotImplementedError),
    (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), torch.ones(1, 1, 3, 3, dtype=torch.bool), NotImplementedError),
    (lambda x: torch.mvlgamma(x, 1), _BOOLS, RuntimeError),
    (lambda x: torch.searchsorted(x, x, side="middle"), torch.arange(4.0), RuntimeError),
    (lambda x: torch.bucketize(x, x), torch.arange(4.0).view(2, 2), RuntimeError),
], ids=["unfold_ints", "reflection_pad1d_bools", "reflection_pad2d_bools", "mvlgamma_bools", "searchsorted_side",
        "bucketize_2d_boundaries"])
def test_ops_eager_refuses_do_not_compute(fn, x, expected):
    # the decompositions (or ember's lowering) computed a result
    _same_error(fn, x, expected=expected)


def test_the_ops_kept_for_eagers_errors_still_compile_for_floats():
    x = torch.randn(1, 2, 4, 4)
    check(lambda x: F.unfold(x, 2) * 2, x)
    check(lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect") + 1, x)
    check(lambda x: F.mse_loss(x, x.flip(-1)), x)
    check(lambda x: torch.searchsorted(torch.tensor([-1.0, 0.0, 1.0]), x, side="right"), x)
