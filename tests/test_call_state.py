"""Later calls of one compiled function: what changed since the first call (input layouts,
sizes, aliasing, settings) must not make ember reuse a graph, plan or kernel that no longer
applies. Each test calls the compiled function several times and compares every call with eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .helpers import assert_same


@pytest.mark.parametrize("dynamic", [None, True])
def test_inplace_write_to_an_overlapping_layout_after_a_dense_one(dynamic):
    """A graph writing its input in place was compiled for a dense input; a later call's input
    has rows that share memory (``as_strided((4, 4), (2, 1))``), which makes Dynamo compile the
    graph again with symbolic strides. The overlap check read only concrete strides, so that
    graph was functionalized and added 1 once per element, where eager adds it once per row that
    reaches the address; and a graph compiled for a layout that did not overlap served one that
    did."""
    def fn(x):
        x.add_(1)
        return x.sum()

    compiled = ember.compile(fn, dynamic=dynamic)
    compiled(torch.zeros(4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (ember's "runs eagerly")
        for strides in [(5, 1), (2, 1), (4, 1), (3, 1)]:
            mine, ref = torch.zeros(24), torch.zeros(24)
            out = compiled(mine.as_strided((4, 4), strides))
            assert_same(out, fn(ref.as_strided((4, 4), strides)))
            assert torch.equal(mine, ref), strides
