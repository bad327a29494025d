"""``embedding_bag`` (``nn.EmbeddingBag``) in sum and mean modes as a segment reduction.

ATen's ``_embedding_bag`` is one opaque op with an opaque backward, so a recommendation model's
bags ran through ATen forward and back. A bag is a row of a ragged tensor: the indices are its
packed values and the offsets its row starts. While AOTAutograd traces, ``embedding_bag`` becomes
the weight's rows gathered at the indices (times the per-sample weights, zero at ``padding_idx``)
reduced per bag by ``ember::segment_reduce`` (divided by the bag's count of real indices for the
mean), so ember generates one kernel that gathers and reduces each bag, and autograd derives the
backward from those ops: the bag's gradient spread over its indices and added into the weight's
rows (and, for per-sample weights, their gradient).

16-bit weights are gathered and summed in float32 and rounded once, as eager's CPU kernel does.
An empty bag gives zeros, as eager. On the CPU only with the ``cpu_embedding_bag`` option (a
float32 forward is slower than eager's there).
Everything else keeps ATen's op: max mode (eager gives a tie's whole gradient to its first
index, where a segment max splits it), ``scale_grad_by_freq``, sparse gradients, and arguments
eager refuses (ATen raises its own error).

The op's other outputs (``offset2bag``, ``bag_size``, ``max_indices``: internals of eager's kernels,
which ``F.embedding_bag`` drops) come from ATen's forward-only kernel, which the trace removes
when nothing reads them.

Offsets: ``ember::bag_bounds`` turns them into the B + 1 row bounds segment kernels read (the
last one T unless ``include_last_offset``), and on the CPU checks them as eager's CPU kernel does
(the first 0, the last at most T; decreasing offsets too, where eager fails an internal check).
Eager's GPU kernels do not check them (reading them would sync), nor does ember there, where it
lowers the op to a cat the kernels read (aten_indexing.py); segment kernels clamp every bound into
[0, T], so no offset reads out of bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

from ..ragged import ops as _ragged_ops  # noqa: F401 -- registers torch.ops.ember.segment_reduce

aten = torch.ops.aten

_SUM, _MEAN = 0, 1  # eager's mode numbers (2 is max)


@torch.library.custom_op("ember::bag_bounds", mutates_args=())
def bag_bounds(offsets: torch.Tensor, total: int, include_last_offset: bool) -> torch.Tensor:
    """(B + 1,) bounds of embedding_bag's bags from its offsets, checked on the CPU as eager's
    CPU kernel checks them."""
    if offsets.device.type == "cpu" and offsets.numel() > 0:
        first, last = int(offsets[0]), int(offsets[-1])
        if first != 0:
            raise RuntimeError("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start "
                               f"from position 0. However, got {first}")
        if last > total:
            raise RuntimeError(f"offsets[-1] can not be greater than input's length {total} but got offsets[-1] "
                               f"of {last}")
        if offsets.numel() > 1 and bool((offsets[1:] < offsets[:-1]).any()):
            raise RuntimeError("embedding_bag: offsets must not decrease (each bag ends where the next starts)")
    if include_last_offset:
        return offsets.clone()
    return torch.cat([offsets, offsets.new_full((1,), total)])


@bag_bounds.register_fake
def _bag_bounds_fake(offsets: torch.Tensor, total: int, include_last_offset: bool) -> torch.Tensor:
    return offsets.new_empty((offsets.shape[0] + (0 if include_last_offset else 1),))


def _generated(cpu: bool, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
               scale_grad_by_freq: bool, mode: int, sparse: bool, per_sample_weights: torch.Tensor | None,
               include_last_offset: bool) -> bool:
    """Whether the call is one the segment form computes as eager (every other keeps ATen's op);
    on the CPU only with ``cpu`` (the ``cpu_embedding_bag`` option)."""
    tensors = [weight, indices, offsets] + ([] if per_sample_weights is None else [per_sample_weights])
    return ((cpu or weight.device.type != "cpu") and mode in (_SUM, _MEAN) and not scale_grad_by_freq and not sparse
            and all(t.layout == torch.strided and t.device == weight.device for t in tensors)
            and weight.dim() == 2 and weight.dtype.is_floating_point
            and indices.dim() == 1 and offsets.dim() == 1
            and indices.dtype in (torch.int32, torch.int64) and offsets.dtype == indices.dtype
            and (offsets.shape[0] > 0 or not include_last_offset)
            and (per_sample_weights is None
                 or (mode == _SUM and per_sample_weights.dtype == weight.dtype
                     and per_sample_weights.shape == indices.shape)))


def _bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: int,
         per_sample_weights: torch.Tensor | None, include_last_offset: bool,
         padding_idx: int | None) -> torch.Tensor:
    bounds = torch.ops.ember.bag_bounds(offsets, indices.shape[0], include_last_offset)
    wide = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) else weight.dtype
    # a gather, not embedding: eager's embedding_bag raises a RuntimeError for an index out of
    # range, as gather does (embedding's is an IndexError)
    rows = torch.gather(weight, 0, indices.long().unsqueeze(1).expand(-1, weight.shape[1])).to(wide)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(wide).unsqueeze(1)
    real = None
    if padding_idx is not None:
        real = indices != padding_idx
        rows = torch.where(real.unsqueeze(1), rows, 0)
    out = torch.ops.ember.segment_reduce(rows, bounds, "sum")
    if mode == _MEAN:
        # a bag's count of real indices (without padding, its length: no kernel of its own)
        count = (bounds[1:] - bounds[:-1] if real is None
                 else torch.ops.ember.segment_reduce(real.to(wide), bounds, "sum"))
        out = out / count.to(wide).clamp(min=1).unsqueeze(1)  # (an empty bag: 0 / 1)
    return out.to(weight.dtype)


def _embedding_bag(op: Any, cpu: bool) -> Callable[..., tuple[torch.Tensor, ...]]:
    def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                      scale_grad_by_freq: bool = False, mode: int = _SUM, sparse: bool = False,
                      per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                      padding_idx: int | None = None) -> tuple[torch.Tensor, ...]:
        args = (weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                include_last_offset)
        if op is aten.embedding_bag.padding_idx:
            args += (padding_idx,)
        rows = weight.shape[0] if weight.dim() == 2 else 0
        if not _generated(cpu, *args[:8]) or (padding_idx is not None and not -rows <= padding_idx < rows):
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, *args)  # (and its errors)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += rows  # eager's wrap
        out = _bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
        with torch.no_grad():
            internals = aten._embedding_bag_forward_only(
                weight.detach(), indices, offsets, False, mode, False,
                None if per_sample_weights is None else per_sample_weights.detach(), include_last_offset,
                -1 if padding_idx is None else padding_idx)[1:]
        return (out, *internals)
    return embedding_bag


def bag_overrides(cpu: bool) -> dict[Any, Callable[..., tuple[torch.Tensor, ...]]]:
    """CompositeImplicitAutograd kernels to use while AOTAutograd traces (``cpu``: on CPU tensors
    too)."""
    return {op: _embedding_bag(op, cpu) for op in (aten.embedding_bag.default, aten.embedding_bag.padding_idx)}
