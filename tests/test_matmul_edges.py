"""Edges of the matmul family (mm, bmm, baddbmm, addmm, addr, matmul, linear, einsum) against
eager: result layouts, special values and sizes that earlier runs got wrong."""

from __future__ import annotations

import torch

import ember

from .helpers import check


def test_baddbmm_of_a_transposed_bias_is_contiguous():
    # eager's baddbmm writes a fresh contiguous result whatever the layout of its bias; torch's
    # decomposition (beta * bias + alpha * bmm) laid the sum out after the bias: the result came
    # back with other strides, and a .view of it failed to trace (the graph ran eagerly)
    def fn(bias, a, b):
        out = torch.baddbmm(bias.transpose(1, 2), a, b, beta=0.5, alpha=2)
        return out, out.view(2, 20) * 2

    bias, a, b = torch.randn(2, 4, 5), torch.randn(2, 5, 3), torch.randn(2, 3, 4)
    report = check(fn, bias, a, b)
    assert report.graphs, "the graph ran eagerly"
    out = ember.compile(fn)(bias, a, b)[0]
    assert out.stride() == fn(bias, a, b)[0].stride() == (20, 4, 1)


def test_addr_with_beta_0_keeps_the_layout_of_its_input():
    # eager's addr is one TensorIterator over the input and both vectors whatever beta is: its
    # result follows a transposed input, whose values beta=0 ignores (NaN too). The decomposition
    # drops the input at beta=0, and its result came back contiguous
    def fn(x, a, b):
        return torch.addr(x.t(), a, b, beta=0, alpha=2)

    x, a, b = torch.full((4, 5), float("nan")), torch.randn(5), torch.randn(4)
    check(fn, x, a, b)
    out = ember.compile(fn)(x, a, b)
    assert out.stride() == fn(x, a, b).stride() == (1, 5)
