"""Reads and writes at indices along any dim (index_select, index_add), and the exception type
eager's CPU kernels raise for a bad index, which depends on the dim they take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check


def _eager_error(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.type


@pytest.mark.parametrize("dim, expected", [(1, IndexError), (-1, RuntimeError)], ids=["middle", "last"])
def test_index_add_bad_index_raises_eagers_type_for_its_dim(dim, expected):
    # eager scatter_adds (a RuntimeError) only along the first or last dim; a middle dim of a
    # 3-d self raised ember's RuntimeError where eager's is an IndexError
    fn = lambda x, i, s: x.index_add(dim, i, s) * 2  # noqa: E731
    x, bad = torch.zeros(4, 5, 6), torch.tensor([0, -1])
    src = torch.ones(4, 2, 6) if dim == 1 else torch.ones(4, 5, 2)
    assert _eager_error(fn, x, bad, src) is expected
    with pytest.raises(expected, match="index_add"):
        ember.compile(fn)(x, bad, src)


@pytest.mark.parametrize("dim, expected", [(1, RuntimeError), (-1, IndexError)], ids=["dim1", "last"])
def test_index_select_along_any_dim_is_generated_with_eagers_errors(dim, expected):
    # along a dim other than 0 index_select ran through ATen, forward and backward
    fn = lambda x, i: x.index_select(dim, i).sin()  # noqa: E731
    x = torch.randn(3, 5, 4, requires_grad=True)
    index = torch.tensor([0, 3, 3, -1 % x.shape[dim]])
    report = check(fn, x, index)
    assert report.fallbacks == []
    out = ember.compile(fn)(x, index)
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expect,) = torch.autograd.grad(fn(x, index).sum(), x)
    assert_same(grad, expect)
    # eager's fast path along dim 1 raises a RuntimeError; its other paths an IndexError
    bad = torch.tensor([0, x.shape[dim]])
    assert _eager_error(fn, x.detach(), bad) is expected
    with pytest.raises(expected, match="index_select"):
        ember.compile(fn)(x.detach(), bad)


@pytest.mark.parametrize("fn", [
    lambda x, i: x.index_select(0, i) + 1, lambda x, i: F.embedding(i, x) + 1,
], ids=["index_select", "embedding"])
def test_a_bad_index_into_an_empty_tensor_raises_as_in_eager(fn):
    # (4, 0): the result has no element for the kernel to check the index at; eager checks
    # every index of an empty self with a RuntimeError
    x, bad = torch.zeros(4, 0), torch.tensor([0, 9])
    assert _eager_error(fn, x, bad) is RuntimeError
    with pytest.raises(RuntimeError):
        ember.compile(fn)(x, bad)


def test_index_tensors_on_dims_apart_are_generated_with_their_dims_first():
    # x[a, :, b] puts the broadcast index dims first in eager's result; it ran through ATen,
    # and so did its backward (an accumulating index_put with the values' index dims first)
    fn = lambda x, a, b: x[a, 1:4, b] * 2  # noqa: E731
    x = torch.randn(4, 5, 6, 3, requires_grad=True)
    a, b = torch.tensor([[0], [3], [-1]]), torch.tensor([1, 5, -6, 1])
    report = check(fn, x.detach(), a, b)
    assert report.fallbacks == []
    report = ember.Report()
    compiled = ember.compile(fn, report=report)
    (grad,) = torch.autograd.grad(compiled(x, a, b).sum(), x)
    (expect,) = torch.autograd.grad(fn(x, a, b).sum(), x)
    assert_same(grad, expect)  # duplicate positions (b's 1 twice) add up, as in eager
    assert report.fallbacks == []
    with pytest.raises(IndexError):
        compiled(x.detach(), a, b + 6)


def test_take_by_a_0d_index_is_generated():
    # torch's decomposition indexed with Python's x[index], which reads a 0-d index with
    # .item(): fake tensors refused it and the whole graph ran eagerly, with a warning
    fn = lambda x, i: torch.take(x, i) * 2 + 1  # noqa: E731
    x = torch.randn(3, 4)
    for i in (torch.tensor(5), torch.tensor(-1), torch.tensor([[0, 11], [-12, 3]])):
        report = check(fn, x, i)
        assert report.kernels and not report.fallbacks, report.fallbacks
    with pytest.raises(IndexError):
        ember.compile(fn)(x, torch.tensor(12))
    with pytest.raises(RuntimeError, match="long"):  # (eager refuses an int32 index too)
        ember.compile(fn)(x, torch.tensor(1, dtype=torch.int32))


def test_narrow_at_a_tensor_start_compiles_with_eagers_errors():
    # Dynamo records x.narrow(dim, t, n) with the tensor t, which the op reads with .item():
    # fake tensors refused it and the whole graph ran eagerly, with a warning. Its start is a
    # size read from t when the program runs: one compile for every start of a sign (torch's
    # narrow guards on the sign, to wrap a negative start).
    fn = lambda x, t: x.narrow(1, t, 2) * 2  # noqa: E731
    x = torch.randn(4, 6, 3)
    compiled = ember.compile(fn)
    before = ember.stats()
    for starts, compiles in (((0, 3, 4), 1), ((-2, -6), 2)):
        for start in starts:
            assert_same(compiled(x, torch.tensor(start)), fn(x, torch.tensor(start)))
        assert ember.stats()["graphs_compiled"] == before["graphs_compiled"] + compiles
    assert ember.stats()["graph_fallbacks"] == before["graph_fallbacks"]
    for start, error in ((5, RuntimeError), (-7, IndexError)):
        assert _eager_error(fn, x, torch.tensor(start)) is error
        with pytest.raises(error, match="start"):
            compiled(x, torch.tensor(start))
    # and its gradient, through the same slice
    w = torch.randn(5, 3, requires_grad=True)
    loss = lambda w, t: (w.narrow(0, t, 2) ** 2).sum()  # noqa: E731
    ember.compile(loss)(w, torch.tensor(3)).backward()
    expected = torch.zeros(5, 3)
    expected[3:] = 2 * w.detach()[3:]
    assert_same(w.grad, expected)
