"""Indexing and data movement compared with eager PyTorch: cases a bug hunt found differing."""

from __future__ import annotations

import pytest
import torch

import ember

from .helpers import check


@pytest.mark.parametrize("dtype, alpha", [(torch.float16, 1e5), (torch.int32, 2**40), (torch.float32, 1e39)])
def test_index_add_alpha_out_of_range_raises_as_eager(dtype, alpha):
    # eager converts alpha to self's dtype with its overflow check: ember multiplied the source
    # by it in a kernel (inf, or wrapped bits) and returned
    x, index, source = torch.ones(3, 2, dtype=dtype), torch.tensor([0, 0]), torch.ones(2, 2, dtype=dtype)

    def fn(x, i, s):
        return x.index_add(0, i, s, alpha=alpha)

    with pytest.raises(RuntimeError, match="without overflow"):
        fn(x, index, source)
    with pytest.raises(RuntimeError, match="without overflow"):
        ember.compile(fn)(x, index, source)


def test_index_add_alpha_in_range_still_fuses():
    check(lambda x, i, s: x.index_add(1, i, s.exp(), alpha=2.5), torch.randn(4, 5), torch.tensor([4, 0, 4]),
          torch.randn(4, 3))


def test_index_put_of_a_0d_mask_into_a_0d_tensor_raises_as_eager():
    # eager counts the mask as one index, more than a 0-d tensor has dims: its IndexError. The
    # masked write (where(mask, v, x)) returned x with v written
    def fn(x, m):
        return x.index_put((m,), torch.tensor(0.0))

    x, m = torch.tensor(1.5), torch.tensor(True)
    with pytest.raises(IndexError, match="too many indices"):
        fn(x, m)
    with pytest.raises(IndexError, match="too many indices"):
        ember.compile(fn)(x, m)


def test_index_put_of_a_0d_mask_into_a_1d_tensor_still_matches_eager():
    check(lambda x, m: x.index_put((m,), torch.tensor(0.0)), torch.randn(3), torch.tensor(True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_index_computed_from_a_bool_gathers_the_right_elements(dtype):
    # GCC 12 vectorized this kernel's gather into reads of element 0 for every lane (CPU fuzz
    # 11005; bench/gcc_bool_gather_probe.cpp): the C++ backend keeps such an index opaque
    torch.manual_seed(0)
    x = torch.randn(127).to(dtype) * 3
    mask = torch.rand(1, 127, 33, 1) < 0.9
    report = check(lambda x, m: torch.softmax(x, -1)[(m + 1).long() % 127], x, mask)
    if all(k.backend == "cpp" for k in report.kernels):
        assert any("ember_opaque_index(" in k.source for k in report.kernels)
    check(lambda x, m: torch.softmax(x, -1).reshape(127, 1)[(m + 1).long()], x, mask)
