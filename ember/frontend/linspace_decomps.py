"""``torch.linspace`` into an integer dtype: the op is kept (ATen computes it), and a Python float
Dynamo made symbolic reaches it as a 0-d tensor, so one graph serves every value.

Eager's CPU kernel (RangeFactoriesKernel.cpp) converts start and end to the integer type first
(truncated, with its overflow check: NaN, inf and values out of range raise), takes a float64
step between them, and writes ``start + step * i`` below ``steps // 2`` and ``end - step *
(steps - 1 - i)`` from there on, each truncated. As built (its AVX2 kernels, measured), both
are fused multiply-adds, rounded once (``linspace(7.9, -3.3, 70001)`` gives 2 at i = 28000, the
product rounded first 3): ember's IR has no such op, and its kernels never form one
(-ffp-contract=off). CUDA's kernel takes a float32 step instead. torch's decomposition computes
in float32, from the untruncated floats, split at ``steps / 2`` (``linspace(0.5, 3.7, 5)`` gave
[0, 1, 2, 2, 3] where eager gives [0, 0, 1, 2, 3]). So no generated kernel reproduces eager
here, and the op stays: eager's values and errors, on any device.

Kept with a symbolic float among its Scalars, the op made torch's pass that turns floats into
tensors specialize the graph on each value (a recompile per call). A symbolic start or end is
therefore passed as a 0-d float64 tensor (the ``Tensor`` overloads, which read it with
``.item()`` into the same Scalar); a Python number stays a Scalar (an int beyond 2**53 exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .aten_scalars import held_tensor

aten = torch.ops.aten
_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
# the overload taking (start, end) as (tensor?, tensor?)
_OVERLOADS = {(False, False): aten.linspace.default, (True, True): aten.linspace.Tensor_Tensor,
              (True, False): aten.linspace.Tensor_Scalar, (False, True): aten.linspace.Scalar_Tensor}


def integer_linspaces(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """``table``'s decompositions of ``aten.linspace``'s overloads, keeping the op for an integer
    dtype (see above)."""
    return {op: _kept_for_integers(table[op]) for op in _OVERLOADS.values() if op in table}


def _kept_for_integers(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    def decompose(start: Any, end: Any, steps: Any, **kwargs: Any) -> Any:
        if kwargs.get("dtype") not in _INTEGERS:
            return decomposition(start, end, steps, **kwargs)
        if not isinstance(start, torch.SymFloat) and not isinstance(end, torch.SymFloat):
            return NotImplemented  # (the op, as it is)
        start, end = (held_tensor(v) if isinstance(v, torch.SymFloat) else v for v in (start, end))
        op = _OVERLOADS[isinstance(start, torch.Tensor), isinstance(end, torch.Tensor)]
        return op(start, end, steps, **kwargs)
    return decompose

