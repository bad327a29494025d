"""Decompositions that give results eager's memory format (channels_last in, channels_last out).

Global average pooling: ATen computes ``adaptive_avg_pool2d(x, 1)`` (and ``adaptive_avg_pool3d(x,
1)``) as ``x.mean((-1, -2), keepdim=True)`` and, for a channels_last input, gives the result
channels_last strides with an in-place ``as_strided_``. Both run at the CompositeImplicitAutograd
key, before any decomposition table is read; AOTAutograd traced the restride as ``as_strided`` and
its gradient as ``as_strided_scatter`` into a zero buffer, and both ran through ATen in every
training step of a channels_last CNN ending in ``AdaptiveAvgPool2d(1)``. The same mean, then a
``clone`` into the input's memory format, gives the result eager's strides (those of an (n, c, 1,
1) channels_last tensor) with ops ember generates: the clone fuses into the mean's kernel, and its
gradient is the incoming one. Every other call keeps ATen's composite.

``channel_shuffle``: torch's decomposition ends in ``.contiguous()``, where eager's kernels (CPU
and CUDA) keep the input's memory format: a ShuffleNet block's output came back contiguous.

``baddbmm``: eager's kernel writes a fresh contiguous result whatever its operands' layouts, where
torch's decomposition ``beta * self + alpha * bmm(b1, b2)`` lays the sum out after ``self``: an
attention bias passed transposed made the result transposed, returned with other strides than
eager's, and a ``.view`` of it failed to trace (the whole graph ran eagerly). ``addr``: eager's
kernel is a TensorIterator over ``self`` and the two vectors whatever ``beta`` is, so its result
follows a transposed ``self``; at ``beta=0`` the decomposition drops ``self`` (eager ignores its
values, NaN included) and its result came back contiguous.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._C import DispatchKey
from torch._decomp import get_decompositions
from torch._prims_common import make_contiguous_strides_for, suggest_memory_format

from .eager_strides import iterator_strides, restrided

aten = torch.ops.aten


def _global_mean(op: Any, rank: int, memory_format: torch.memory_format) -> Callable[..., torch.Tensor]:
    def pool(input: torch.Tensor, output_size: Sequence[Any]) -> torch.Tensor:
        if (input.layout == torch.strided and not input.is_quantized and input.dim() == rank
                and len(output_size) == rank - 2 and all(isinstance(n, int) and n == 1 for n in output_size)
                and suggest_memory_format(input) == memory_format):
            out = input.mean(list(range(-1, 1 - rank, -1)), keepdim=True)
            return out.clone(memory_format=memory_format)
        # (ATen's own composite: its checks, its mean for contiguous inputs, its pooling op)
        return op._op_dk(DispatchKey.CompositeImplicitAutograd, input, output_size)
    return pool


def layout_overrides() -> dict[Any, Callable[..., torch.Tensor]]:
    """CompositeImplicitAutograd kernels to use while AOTAutograd traces."""
    return {aten.adaptive_avg_pool2d.default: _global_mean(aten.adaptive_avg_pool2d.default, 4, torch.channels_last),
            aten.adaptive_avg_pool3d.default: _global_mean(aten.adaptive_avg_pool3d.default, 5,
                                                           torch.channels_last_3d)}


def _in_input_format(decomposition: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def decompose(input: torch.Tensor, *args: Any) -> torch.Tensor:
        out = decomposition(input, *args)
        if input.numel() == 0:  # (eager returns an alias of the input, as the decomposition does)
            return out
        return out.contiguous(memory_format=suggest_memory_format(input))
    return decompose


def _contiguous(out: torch.Tensor, *_: Any, **__: Any) -> tuple[Any, ...]:
    return tuple(make_contiguous_strides_for(out.shape))


def _addr_strides(out: torch.Tensor, self: Any, vec1: Any, vec2: Any, *_: Any, **__: Any) -> tuple[Any, ...] | None:
    """TensorIterator's strides over eager's operands: ``self``, vec1 as a column, vec2."""
    if not all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in (self, vec1, vec2)):
        return None
    if vec1.dim() != 1 or vec2.dim() != 1:
        return None  # (the decomposition has raised eager's error already)
    operands = [(tuple(self.shape), tuple(self.stride())), ((vec1.shape[0], 1), (vec1.stride(0), 1)),
                (tuple(vec2.shape), tuple(vec2.stride()))]
    return iterator_strides(tuple(out.shape), operands)


def layout_decompositions() -> dict[Any, Callable[..., torch.Tensor]]:
    """Table entries: torch's decompositions, with eager's memory format."""
    shuffle, baddbmm, addr = aten.channel_shuffle.default, aten.baddbmm.default, aten.addr.default
    table = get_decompositions([shuffle, baddbmm, addr])
    return {shuffle: _in_input_format(table[shuffle]), baddbmm: restrided(table[baddbmm], _contiguous),
            addr: restrided(table[addr], _addr_strides)}
