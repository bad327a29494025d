"""``torch.ops.ember.segment_reduce``: one reduction per row of a packed ragged tensor.

    out = torch.ops.ember.segment_reduce(values, offsets, "sum")   # (B, *feature)

``values`` is (T, *feature), ``offsets`` (B+1,) int32/int64 with row b at values[offsets[b] :
offsets[b+1]]; ``reduce`` is "sum", "amax" or "amin". An empty row gives the identity (0, -inf /
the dtype's minimum, +inf / its maximum). The offsets must be a valid ragged layout (start at 0,
never decrease, end at T), as ``Ragged`` checks when it is built: they are device data, and
checking them here would sync with the device on every call.

Why an op of its own: written in plain ATen (a scatter of every packed row into its segment by
``row_ids()``), the reduction reaches a compiler as an index_add or scatter_reduce, and the best
kernel for it is then a scatter with atomic adds. As one op, ember lowers it to a segment
reduction: each program reads its row's offsets on the device and reduces the row's values in
registers, with no atomics, no row ids, and a launch grid that does not depend on T. Eager
PyTorch, and compilers that do not know the op, run the scatter below. The op has autograd.
"""

from __future__ import annotations

import torch

REDUCES = ("sum", "amax", "amin")


def check_args(values: torch.Tensor, offsets: torch.Tensor, reduce: str) -> None:
    """Errors eager and ember share (shapes and dtypes; the offsets' values are ``Ragged``'s to
    validate, since reading them would sync with the device)."""
    if reduce not in REDUCES:
        raise ValueError(f"segment_reduce: reduce must be one of {REDUCES}, got {reduce!r}")
    if offsets.dim() != 1 or offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"segment_reduce: offsets must be a 1-d int32 or int64 tensor, got "
                         f"{offsets.dim()}-d {offsets.dtype}")
    if offsets.shape[0] < 1:
        raise ValueError("segment_reduce: offsets needs at least one element (B + 1 for B rows)")
    if values.dim() < 1:
        raise ValueError("segment_reduce: values must have a packed first dimension, got a 0-d tensor")
    if values.device != offsets.device:
        raise ValueError(f"segment_reduce: values on {values.device} and offsets on {offsets.device}")
    if values.dtype == torch.bool or values.is_complex():
        raise TypeError(f"segment_reduce: {values.dtype} values are not supported")


def identity(reduce: str, dtype: torch.dtype) -> float | int | bool:
    """What an empty row reduces to ("sum", "amax" or "amin")."""
    if reduce == "sum":
        return 0
    if dtype == torch.bool:
        return reduce != "amax"
    if dtype.is_floating_point:
        return float("-inf") if reduce == "amax" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


def row_ids(offsets: torch.Tensor, total: int | torch.SymInt) -> torch.Tensor:
    """(T,) int64: the row of each packed position (a binary search in the offsets, no sync).

    One op, ``ember::row_ids``, rather than the searchsorted it runs: ember compiles the row ids
    of offsets that a ``Ragged`` validated (starting at 0, ending at T) into segment kernels,
    segment sums and gathers that rely on that. Hand-written searches of other offsets stay
    searches, computed as such."""
    return torch.ops.ember.row_ids(offsets, total)


@torch.library.custom_op("ember::row_ids", mutates_args=())
def _row_ids(offsets: torch.Tensor, total: int) -> torch.Tensor:
    index = torch.arange(total, device=offsets.device, dtype=offsets.dtype)
    return torch.searchsorted(offsets[1:], index, right=True)


@_row_ids.register_fake
def _row_ids_fake(offsets: torch.Tensor, total: int) -> torch.Tensor:
    return offsets.new_empty((total,), dtype=torch.int64)


@torch.library.custom_op("ember::segment_reduce", mutates_args=())
def segment_reduce(values: torch.Tensor, offsets: torch.Tensor, reduce: str) -> torch.Tensor:
    check_args(values, offsets, reduce)
    batch = offsets.shape[0] - 1
    out = values.new_full((batch, *values.shape[1:]), identity(reduce, values.dtype))
    rows = row_ids(offsets, values.shape[0])
    if reduce == "sum":
        return out.index_add_(0, rows, values)
    index = rows.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
    return out.scatter_reduce_(0, index, values, reduce=reduce, include_self=True)


@segment_reduce.register_fake
def _segment_reduce_fake(values: torch.Tensor, offsets: torch.Tensor, reduce: str) -> torch.Tensor:
    check_args(values, offsets, reduce)
    return values.new_empty((offsets.shape[0] - 1, *values.shape[1:]))


def _setup_context(ctx, inputs, output) -> None:  # noqa: ANN001 -- torch.library's signature
    values, offsets, reduce = inputs
    ctx.reduce = reduce
    ctx.total = values.shape[0]
    if reduce == "sum":
        ctx.save_for_backward(offsets)
    else:
        ctx.save_for_backward(offsets, values, output)


def _backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN202 -- torch.library's signature
    offsets, *saved = ctx.saved_tensors
    rows = row_ids(offsets, ctx.total)
    spread = grad[rows]  # each packed row gets its segment's gradient
    if ctx.reduce == "sum":
        return spread, None, None
    # amax/amin: the gradient goes to the row's extremes, split evenly between ties. Written as
    # amax's backward (grad / count * mask), not as a where: a row whose extreme is NaN has no
    # element equal to it (count 0), and amax's gradient is NaN there, not a silent 0
    values, output = saved
    # ties counted (and the gradient divided) in float32 at least, rounded once: a 16-bit sum
    # stops counting at 256 (bfloat16) or 2048 (float16) ties, e.g. a long row of ReLU zeros
    wide = torch.promote_types(grad.dtype, torch.float32)
    hit = (values == output[rows]).to(wide)
    count = segment_reduce(hit, offsets, "sum")
    return (spread.to(wide) / count[rows] * hit).to(grad.dtype), None, None


segment_reduce.register_autograd(_backward, setup_context=_setup_context)
