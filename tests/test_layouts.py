"""Outputs laid out as eager lays them out: the strides a user sees (``.view`` raises on the
wrong ones, ``is_contiguous`` answers otherwise), with the values."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same


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
