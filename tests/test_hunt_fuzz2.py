"""Found by a second differential fuzzer (random programs of views, cat/split, indexing, scans,
sorts, matmuls, norms and in-place writes to inputs and their views, against eager): a write
reading a view that shares elements with it, neither dense, which eager's overlap check does not
look at and its kernel writes in its own order."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.frontend.overlap import _share_an_element

from .conftest import DEVICE
from .helpers import assert_same


def _shift_right(x):
    x[:, 1:] = x[:, :-1]
    return x * 2


def _shift_right_copy(x):
    x[:, 1:].copy_(x[:, :-1])
    return x * 2


def _add_left_neighbour(x):
    x[:, 1:] += x[:, :-1]
    return x * 2


@pytest.mark.filterwarnings("ignore:ember. a graph writes")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("fn", [_shift_right, _shift_right_copy, _add_left_neighbour], ids=lambda f: f.__name__)
def test_a_write_reading_an_overlapping_view_that_is_not_dense_is_eagers(fn, dynamic):
    # x[:, 1:] and x[:, :-1] are not dense: eager's overlap check gives up ("too hard"), raises
    # nothing, and its copy reads what it wrote (each row's first element along the row);
    # functionalized, every element was read as it was before the write
    x = torch.randn(4, 5, device=DEVICE)
    ref_x, out_x = x.clone(), x.clone()
    ref = fn(ref_x)
    assert_same(ember.compile(fn, dynamic=dynamic)(out_x), ref)
    assert_same(out_x, ref_x)


def test_views_sharing_no_element_still_compile():
    def fn(x):
        x[:, 0] = x[:, 1]
        x[:, 1::2] += x[:, ::2][:, :2]
        return x * 2

    x = torch.randn(4, 5, device=DEVICE)
    ref_x, out_x = x.clone(), x.clone()
    fallbacks = ember.stats()["graph_fallbacks"]
    assert_same(ember.compile(fn)(out_x), fn(ref_x))
    assert_same(out_x, ref_x)
    assert ember.stats()["graph_fallbacks"] == fallbacks


def test_views_sharing_no_element_compile_with_symbolic_sizes():
    # with symbolic strides the exact check cannot run; x[:, 0] and x[:, 1] of an (s0, s1)
    # tensor are 1 apart, less than their stride s1 >= 2, which ran the graph eagerly
    # (x[:, 0] = x[:, 1] of a 3-d x, s2 apart with a smallest stride of 1, still runs eagerly)
    def columns(x):
        x[:, 0] = x[:, 1]
        return x * 2

    def last_dim(x):
        x[:, :, 2] += x[:, :, 0]
        return x * 2

    for fn, shapes in [(columns, [(4, 5), (6, 3)]), (last_dim, [(3, 4, 5), (2, 6, 3)])]:
        compiled = ember.compile(fn, dynamic=True)
        fallbacks, graphs = ember.stats()["graph_fallbacks"], ember.stats()["graphs_compiled"]
        for shape in shapes:
            x = torch.randn(shape, device=DEVICE)
            ref_x, out_x = x.clone(), x.clone()
            assert_same(compiled(out_x), fn(ref_x))
            assert_same(out_x, ref_x)
        assert ember.stats()["graph_fallbacks"] == fallbacks
        assert ember.stats()["graphs_compiled"] == graphs + 1


def test_which_strided_views_share_an_element():
    x = torch.zeros(4, 5)
    assert not _share_an_element(x[:, 0], x[:, 1])
    assert not _share_an_element(x[::2], x[1::2])
    assert not _share_an_element(x[:, ::2], x[:, 1::2])
    assert _share_an_element(x[:, 1:], x[:, :-1])
    assert _share_an_element(x[:, ::2], x[:, 2::2])
    assert _share_an_element(x[1:, 1:], x[:-1, :-1])
    assert _share_an_element(x[:, 0], x[:, 1].to(torch.float64))  # (other layouts: not looked at)
