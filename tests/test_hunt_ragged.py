"""Regressions found hunting bugs in ember.ragged, each compared with eager PyTorch."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import ragged
from ember.ragged import Ragged


@pytest.mark.parametrize("dtype, ties", [(torch.bfloat16, 300), (torch.float16, 2100)])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "ember"])
def test_segment_max_gradient_splits_many_ties_like_amax(dtype, ties, compiled):
    """A row of more ties than a 16-bit sum counts (256 for bfloat16, 2048 for float16: a long
    row of ReLU zeros) shares the gradient as amax does; the count was summed in the values'
    dtype, stuck at 256 / 2048."""
    values = torch.zeros(ties + 2, dtype=dtype)
    values[ties:] = torch.tensor([1.0, -1.0])
    offsets = torch.tensor([0, ties, ties + 2])
    ref = values.clone().requires_grad_()
    torch.stack([ref[:ties].amax(0), ref[ties:].amax(0)]).sum().backward()
    leaf = values.clone().requires_grad_()
    fn = (lambda r: ragged.segment_max(r).sum())
    (ember.compile(fn) if compiled else fn)(Ragged(leaf, offsets)).backward()
    assert leaf.grad.dtype == dtype
    torch.testing.assert_close(leaf.grad, ref.grad)
