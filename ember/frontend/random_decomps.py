"""Random ops traced so that a compiled program draws what eager draws under one seed.

ember runs random draws through ATen in program order, so a compiled program and eager take the
same numbers from the generator, provided the traced graph asks for the same draws. Two of
torch's tracing paths changed them:

* ``dropout``: torch's Python decomposition (at the Autograd and CompositeImplicitAutograd keys)
  calls ``native_dropout`` for any ``p != 0``. Eager's kernel (``_dropout_impl``, and on GPUs
  the fused kernel only for 0 < p < 1) draws nothing at ``p = 1`` (it multiplies by 0) or for
  an empty input, and where nothing is dropped (``p = 0``, or not training) returns the input
  itself. The compiled ``p = 1`` drew a mask, and every later draw differed from eager's; a
  write into the result of an evaluation-mode dropout did not reach its input.
* ``bernoulli_`` with a float ``p``: functionalization makes it ``bernoulli.p``, whose ATen
  kernel draws into a new row-major tensor, where the in-place op draws in the memory order of
  the tensor it fills. A transposed tensor's mask came out transposed (alpha_dropout of a
  transposed activation: ATen fills an ``empty_like`` of it in place).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm
from torch._subclasses.functional_tensor import FunctionalTensorMode
from torch.fx.experimental.symbolic_shapes import guard_or_false

aten = torch.ops.aten


def dropout(input: torch.Tensor, p: float, train: bool | None) -> torch.Tensor:
    """``aten.dropout`` as eager's kernel computes it: a mask drawn only for 0 < p < 1."""
    if not train or p == 0 or guard_or_false(input.numel() == 0):
        return input  # (eager's result is the input itself)
    if p == 1:
        # (no draw; a multiplication, so inf and NaN give NaN as in eager)
        return input * torch.zeros((), dtype=input.dtype, device=input.device)
    return aten.native_dropout.default(input, p, train)[0]


def dropout_overrides() -> dict[tuple[Any, DispatchKey], Any]:
    """The Python kernels to install while AOTAutograd traces, by (op, dispatch key)."""
    return {(aten.dropout.default, DispatchKey.Autograd): dropout,
            (aten.dropout.default, DispatchKey.CompositeImplicitAutograd): dropout}


def _bernoulli_(mode: FunctionalTensorMode, self: torch.Tensor, p: float = 0.5, *,
                generator: Any = None) -> torch.Tensor:
    """``self.bernoulli_(p)`` under functionalization, drawn in ``self``'s memory order:
    ``bernoulli.p`` of ``self`` permuted so that its outermost dim in memory comes first."""
    order, _ = compute_elementwise_output_logical_to_physical_perm(self) if self.dim() > 1 else (
        list(range(self.dim())), False)
    with mode:
        if order == sorted(order):
            drawn = aten.bernoulli.p(self, p, generator=generator)
        else:
            back = sorted(range(len(order)), key=order.__getitem__)
            drawn = aten.bernoulli.p(self.permute(order), p, generator=generator).permute(back)
        return self.copy_(drawn)


@contextlib.contextmanager
def functional_bernoulli() -> Iterator[None]:
    """While AOTAutograd traces: ``bernoulli_`` functionalized by ``_bernoulli_`` (removed after,
    so other backends in the process keep torch's)."""
    op = aten.bernoulli_.float
    saved = op.python_key_table.get(FunctionalTensorMode)
    op.python_key_table[FunctionalTensorMode] = _bernoulli_
    op._dispatch_cache.clear()
    try:
        yield
    finally:
        if saved is None:
            op.python_key_table.pop(FunctionalTensorMode, None)
        else:
            op.python_key_table[FunctionalTensorMode] = saved
        op._dispatch_cache.clear()
