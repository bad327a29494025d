"""Reductions, scans and indexing against eager, found by a bug hunt: copies of inputs whose size-1
dims have strides of their own under symbolic sizes; index_fill with a 0-d value tensor of another
dtype than self's."""

from __future__ import annotations

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import assert_same


def test_a_copy_keeps_the_stride_of_a_size_one_dim_under_symbolic_sizes():
    # a (1, n, m) row of a larger tensor's storage: eager's copy keeps its stride along dim 0,
    # a size symbol no shape and no kernel reads, which the host program then never bound
    def f(y):
        return y.float(), y.double() * 2

    compiled = ember.compile(f, dynamic=True)
    for n, m in ((2, 16), (5, 17), (3, 4)):
        rows = torch.randn(3, n, m, device=DEVICE).half()
        y = rows[::3]
        out, ref = compiled(y), f(y)
        assert_same(list(out), list(ref))
        assert [o.stride() for o in out] == [r.stride() for r in ref]


@pytest.mark.parametrize("dtype, value", [
    (torch.float16, torch.tensor(2.5)),                      # float32 into float16: ATen's (overflow check)
    (torch.float32, torch.tensor(3)),                        # int64 into float32: converted
    (torch.float64, torch.tensor(-1.5, dtype=torch.float32)),
    (torch.int64, torch.tensor(True)),
    (torch.bool, torch.tensor(2.5)),
    (torch.float16, torch.tensor(1e30)),                     # eager's overflow error
    (torch.int8, torch.tensor(300)),                         # eager's overflow error
], ids=str)
def test_index_fill_takes_a_value_tensor_of_another_dtype_as_eager(dtype, value):
    # eager fills with the 0-d value's item(); the decomposition's index_copy refused a source
    # of another dtype than self's (a RuntimeError where eager computes)
    def f(x, v):
        return x.index_fill(1, torch.tensor([0, -1], device=DEVICE), v) * 1

    x = (torch.randn(3, 4, device=DEVICE) * 4).to(dtype)
    value = value.to(DEVICE)
    try:
        ref = f(x, value)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            ember.compile(f)(x, value)
        return
    assert_same(ember.compile(f)(x, value), ref)


def test_index_fill_with_a_value_tensor_and_an_int32_index_raises_eagers_index_error():
    x, index = torch.randn(3, 4, device=DEVICE), torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    with pytest.raises(IndexError):
        x.index_fill(1, index, torch.tensor(2.0, device=DEVICE))
    with pytest.raises(IndexError):
        ember.compile(lambda x, i: x.index_fill(1, i, torch.tensor(2.0, device=DEVICE)))(x, index)
