"""Per-row reductions and softmax of a ``Ragged``, in plain torch ops, with no host sync.

    pooled = ragged.segment_mean(tokens)        # (B, *feature): mean of each document's rows
    totals = ragged.segment_sum(tokens)         # (B, *feature)
    peaks = ragged.segment_max(tokens)          # (B, *feature); empty rows give -inf
    probs = ragged.jagged_softmax(scores)       # a Ragged: softmax within each row

Why these exist: written by hand, a per-row reduction is either a Python loop over the batch (B
small kernels and a host sync per row to read the offsets) or a padded tensor with a mask (work
and memory for the longest row times B). These functions scatter the packed rows into their row
with ``index_add`` / ``scatter_reduce`` over ``row_ids()``, so they run in a fixed number of ATen
ops whatever B and the lengths are, never read a tensor's data on the host (they are safe inside
CUDA graphs and trace into one graph under ``torch.compile(fullgraph=True)``), and support
autograd. Compiled by ember, the ``index_add`` sums become one kernel each that computes the rows
and adds them into their segment atomically (``segment_max`` and ``jagged_softmax``'s maximum
still run ``scatter_reduce`` through ATen).

Precision: sums of 16-bit floats accumulate in float32 and round once at the end (like
``Tensor.sum`` does), since adding a few hundred bfloat16 rows one by one in bfloat16 loses most
of their bits.
"""

from __future__ import annotations

import torch

from .tensor import Ragged

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _check(r: object, name: str) -> Ragged:
    if not isinstance(r, Ragged):
        raise TypeError(f"{name} expects a Ragged, got {type(r).__name__}")
    return r


def _sum_rows(values: torch.Tensor, row_ids: torch.Tensor, batch: int) -> torch.Tensor:
    """(B, *feature) row sums of ``values`` in its accumulation dtype."""
    acc = _accumulate_dtype(values.dtype)
    out = torch.zeros((batch, *values.shape[1:]), dtype=acc, device=values.device)
    return out.index_add(0, row_ids, values.to(acc))


def segment_sum(r: Ragged) -> torch.Tensor:
    """(B, *feature): the sum of each row's values (0 for an empty row), in ``r.dtype``."""
    r = _check(r, "segment_sum")
    return _sum_rows(r.values, r.row_ids(), r.batch_size).to(r.dtype)


def segment_mean(r: Ragged) -> torch.Tensor:
    """(B, *feature): the mean of each row's values (0 for an empty row), in ``r.dtype``.

    Floating-point values only (as ``Tensor.mean``)."""
    r = _check(r, "segment_mean")
    if not r.dtype.is_floating_point:
        raise TypeError(f"segment_mean needs floating-point values, got {r.dtype}")
    sums = _sum_rows(r.values, r.row_ids(), r.batch_size)
    lengths = r.lengths().clamp(min=1).to(sums.dtype)
    return (sums / lengths.view(-1, *([1] * (sums.dim() - 1)))).to(r.dtype)


def segment_max(r: Ragged) -> torch.Tensor:
    """(B, *feature): the maximum of each row's values, in ``r.dtype``; an empty row gives the
    identity of max (-inf for floats, the dtype's minimum for integers). The gradient goes to the
    row's maxima (split evenly between ties, as ``amax``)."""
    r = _check(r, "segment_max")
    return _max_rows(r.values, r.row_ids(), r.batch_size)


def _max_rows(values: torch.Tensor, row_ids: torch.Tensor, batch: int) -> torch.Tensor:
    if values.dtype.is_floating_point:
        lowest = float("-inf")
    elif values.dtype == torch.bool:
        lowest = False
    else:
        lowest = torch.iinfo(values.dtype).min
    out = torch.full((batch, *values.shape[1:]), lowest, dtype=values.dtype, device=values.device)
    index = row_ids.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    return out.scatter_reduce(0, index, values, reduce="amax", include_self=True)


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
    shift = _max_rows(x.detach(), row_ids, r.batch_size)
    e = torch.exp(x - shift[row_ids])
    out = e / _sum_rows(e, row_ids, r.batch_size)[row_ids]
    return Ragged._make(out.to(r.dtype), r.offsets, r.max_length)
