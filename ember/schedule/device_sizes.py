"""Ragged totals read on the device: one launch serves every total length up to its grid's.

A ragged tensor's total length T changes every batch. A kernel that takes T from the host needs
a new launch (new arguments, a new grid) for every T, so a CUDA graph captured once is only right
for the T it was captured at. A ``Ragged``'s offsets end at T, so a kernel over T rows (or that
divides by T, as a mean does) can load T from ``offsets[-1]`` instead (``ir.node.ragged_totals``
finds the pairs). The host's T then only sizes the grid and the buffers: a program captured with
a capacity C >= T, its buffers holding C rows, computes every batch of at most C rows exactly,
the rows past T left alone (``ember.cuda_graph``). A kernel takes the smaller of the two, so it
never runs past the buffers the host sized.

Only ``ember.cuda_graph`` steps read the totals on the device: such kernels take one more size,
``device_totals``, which the host program sets to 1 inside a graphed step (runtime/capture.py)
and to 0 elsewhere. A plain call computes every one of the host's T rows, as eager does.

Matmul kernels keep the host's sizes: their tiles and TMA descriptors are fixed at launch.
"""

from __future__ import annotations

import sympy

from ..ir import shapes as sh
from ..ir.node import Node
from .group_spec import BufferInfo
from .kernel_ir import Kernel, Param

# the size that switches reading the totals on the device on (1, in ember.cuda_graph steps) or off
DEVICE_TOTALS = sympy.Symbol("device_totals", integer=True, nonnegative=True)


def read_totals_on_device(kernel: Kernel, totals: dict[sympy.Symbol, Node], infos: dict[Node, BufferInfo]) -> None:
    """Mark the ragged totals among ``kernel``'s sizes to be loaded from their offsets (added as
    a parameter when the kernel does not read them already)."""
    if kernel.dots:
        return
    for symbol in list(kernel.sizes):
        offsets = totals.get(symbol)
        if offsets is None or offsets not in infos:
            continue
        name = infos[offsets].name
        if all(p.name != name for p in kernel.params):
            first_output = next((i for i, p in enumerate(kernel.params) if p.is_output), len(kernel.params))
            kernel.params.insert(first_output, Param(name, offsets.dtype, False))
        # (offsets may be a strided view: a Ragged accepts them)
        index = sympy.expand((sh.expr(offsets.shape[0]) - 1) * sh.expr(infos[offsets].strides[0]))
        kernel.device_sizes[symbol] = (name, index)
        kernel.sizes = sorted(set(kernel.sizes) | index.free_symbols | {DEVICE_TOTALS}, key=lambda s: s.name)
