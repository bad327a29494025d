"""Per-row reductions and softmax of a ``Ragged``, in plain torch ops, with no host sync.

    pooled = ragged.segment_mean(tokens)        # (B, *feature): mean of each document's rows
    totals = ragged.segment_sum(tokens)         # (B, *feature)
    peaks = ragged.segment_max(tokens)          # (B, *feature); empty rows give -inf
    probs = ragged.jagged_softmax(scores)       # a Ragged: softmax within each row

Why these exist: written by hand, a per-row reduction is either a Python loop over the batch (B
small kernels and a host sync per row to read the offsets) or a padded tensor with a mask (work
and memory for the longest row times B). These functions are ``torch.ops.ember.segment_reduce``
(see ``ops.py``) plus pointwise work, so they run in a fixed number of ops whatever B and the
lengths are, never read a tensor's data on the host (they are safe inside CUDA graphs and trace
into one graph under ``torch.compile(fullgraph=True)``), and support autograd. Eager PyTorch runs
the reduction as a scatter by ``row_ids()``. Compiled by ember, each becomes a segment kernel: one
program per row (and feature block) reads the row's start and length from the offsets and
reduces it in registers, with no atomics, and a launch grid that does not depend on T. Work on
the packed values that reads per-row results by ``row_ids()`` joins that kernel: a jagged
softmax is one kernel (max, sum, and the normalized values stored as it walks the row).

Precision: sums of 16-bit floats accumulate in float32 and round once at the end (like
``Tensor.sum`` does), since adding a few hundred bfloat16 rows one by one in bfloat16 loses most
of their bits.
"""

from __future__ import annotations

import torch

from .ops import segment_reduce
from .tensor import Ragged

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _check(r: object, name: str) -> Ragged:
    if not isinstance(r, Ragged):
        raise TypeError(f"{name} expects a Ragged, got {type(r).__name__}")
    return r


def _sum_rows(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(B, *feature) row sums of ``values`` in its accumulation dtype."""
    return segment_reduce(values.to(_accumulate_dtype(values.dtype)), offsets, "sum")


def segment_sum(r: Ragged) -> torch.Tensor:
    """(B, *feature): the sum of each row's values (0 for an empty row). Floating and complex
    values keep ``r.dtype``; integers and bools sum in int64, as ``Tensor.sum`` sums them (three
    uint8 values of 200 are 600, not 88; bools count masked tokens per row)."""
    r = _check(r, "segment_sum")
    if r.dtype.is_complex:  # (the real and imaginary parts summed as a trailing pair of floats)
        return torch.view_as_complex(segment_sum(Ragged._make(
            torch.view_as_real(r.values), r.offsets, r._max_length)).contiguous())
    if not r.dtype.is_floating_point:
        return _sum_rows(r.values.to(torch.int64), r.offsets)
    return _sum_rows(r.values, r.offsets).to(r.dtype)


def segment_mean(r: Ragged) -> torch.Tensor:
    """(B, *feature): the mean of each row's values (0 for an empty row), in ``r.dtype``.

    Floating-point values only (as ``Tensor.mean``)."""
    r = _check(r, "segment_mean")
    if not r.dtype.is_floating_point:
        raise TypeError(f"segment_mean needs floating-point values, got {r.dtype}")
    sums = _sum_rows(r.values, r.offsets)
    lengths = r.lengths().clamp(min=1).to(sums.dtype)
    return (sums / lengths.view(-1, *([1] * (sums.dim() - 1)))).to(r.dtype)


def segment_max(r: Ragged) -> torch.Tensor:
    """(B, *feature): the maximum of each row's values, in ``r.dtype``; an empty row gives the
    identity of max (-inf for floats, the dtype's minimum for integers). The gradient goes to the
    row's maxima (split evenly between ties, as ``amax``)."""
    r = _check(r, "segment_max")
    if r.dtype == torch.bool:  # the op takes numbers; max over bools is any
        return segment_reduce(r.values.to(torch.uint8), r.offsets, "amax").to(torch.bool)
    return segment_reduce(r.values, r.offsets, "amax")


def jagged_softmax(r: Ragged) -> Ragged:
    """Softmax over each row's values (along the packed dimension, separately for every feature
    element), as a Ragged with the same offsets: what ``torch.softmax(padded, dim=1)`` gives
    when the padding is -inf, without the padding. 16-bit values compute in float32 and round
    once, like ``torch.softmax``.
    """
    r = _check(r, "jagged_softmax")
    if not r.dtype.is_floating_point:
        raise TypeError(f"jagged_softmax needs floating-point values, got {r.dtype}")
    row_ids = r.row_ids()
    x = r.values.to(_accumulate_dtype(r.dtype))
    # The row maximum only shifts the exponent for stability; softmax does not depend on it, so
    # it carries no gradient (and needs no scatter_reduce backward).
    shift = segment_reduce(x.detach(), r.offsets, "amax")
    e = torch.exp(x - shift[row_ids])
    out = e / _sum_rows(e, r.offsets)[row_ids]
    # r._max_length, not r.max_length: a Ragged built in compiled code without one finds it
    # when read, and reading it here would break the graph (a host sync) just to pass it on
    return Ragged._make(out.to(r.dtype), r.offsets, r._max_length)
