"""Ops that move elements along a dim (flip, unfold, slice_scatter) and reads and writes at
indices that ran through ATen (embedding, index_copy, index_fill): each a kernel over its result,
equal to eager, with eager's errors for bad indices and sources."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check, compile_checked


def _scatters(x, a, b):
    y = x.clone()
    y[:, 1:4] = a       # step 1: the source padded into place
    y[1::2, -2:] = b    # step 2, from the end
    return y * 2


@pytest.mark.parametrize("fn, args", [
    (lambda x: x.flip(0, -1) + x.unfold(1, 3, 1)[:, :, 0].sum(1, keepdim=True), (torch.randn(4, 5),)),
    (lambda x: x.unfold(0, 2, 3) * 2, (torch.arange(7).reshape(7, 1),)),
    (_scatters, (torch.randn(5, 6), torch.randn(5, 3), torch.randn(2, 2))),
    (lambda w, i: F.embedding(i, w, padding_idx=1) * 2, (torch.randn(6, 3), torch.tensor([[0, 5], [1, 1]]))),
    (lambda w, i: F.embedding(i, w) + 1, (torch.randn(6, 3).bfloat16(), torch.tensor([5, 0], dtype=torch.int32))),
    (lambda x, i, s: x.index_copy(1, i, s * 2), (torch.randn(3, 5), torch.tensor([4, 0]), torch.randn(3, 2))),
    (lambda x, i: x.index_fill(1, i, -1.5), (torch.randn(3, 5), torch.tensor([-1, 0]))),
], ids=["flip_unfold", "unfold_ints", "slice_scatter", "embedding", "embedding_int32", "index_copy", "index_fill"])
def test_moves_and_lookups_are_kernels_like_eager(fn, args):
    report = check(fn, *args)
    assert report.fallbacks == [] and report.kernels


def test_their_gradients_match_eager():
    def fn(x, w, i):
        y = x.flip(1).unfold(0, 2, 1).sum(-1)
        z = y.clone()
        z[:, 1:] = y[:, 1:] * F.embedding(i, w)
        return z.sum()

    x, w, i = torch.randn(4, 3), torch.randn(5, 2), torch.tensor([4, 0, 4])
    grads = []
    for f in (fn, ember.compile(fn)):
        leaves = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        f(*leaves, i).backward()
        grads.append([t.grad for t in leaves])
    assert_same(grads[1], grads[0])


def test_symbolic_sizes_do_not_recompile():
    def fn(x, k):
        y = x.flip(0)
        y[1::2] = y[1::2] * k    # slice_scatter of a source shaped by the same slice
        y[-2:] = 0               # from the end, of any size
        return y

    compiled, report = compile_checked(fn, dynamic=True)
    for n in (5, 8, 9):
        x = torch.randn(n, 3)
        assert_same(compiled(x, 3.0), fn(x, 3.0))
    assert len(report.graphs) == 1 and report.fallbacks == []


def test_bad_indices_and_sources_raise_as_in_eager():
    w = torch.randn(4, 2)
    with pytest.raises(IndexError, match="embedding"):  # no negative rows: eager's IndexError
        ember.compile(lambda w, i: F.embedding(i, w) * 2)(w, torch.tensor([0, -1]))
    with pytest.raises(IndexError, match="index_copy"):
        ember.compile(lambda x, i, s: x.index_copy(0, i, s) * 2)(w, torch.tensor([4]), torch.ones(1, 2))
    # a source not shaped like the slice: eager's RuntimeError, not a write past it
    fn = lambda x, s: torch.slice_scatter(x, s, 0, 1, 3) * 2  # noqa: E731
    with pytest.raises(RuntimeError, match="size"):
        ember.compile(fn)(torch.randn(6, 2), torch.randn(3, 2))
