"""Linear, bilinear and trilinear upsampling, each output a weighted sum of its neighbours as
eager's kernels compute it.

torch traces ``F.interpolate``'s linear modes through a Python decomposition (at the Autograd
key, before ember's table is read) that combines two neighbours as ``x0 + (x1 - x0) * w``. Eager's
kernels compute ``x0 * (1 - w) + x1 * w``. The two agree on finite values up to rounding, but not
next to an infinity: between -inf and 2.0 at w = 0.5 eager gives -inf and the decomposition
-inf + inf, NaN (CPU fuzz seed 341522607868). ``pool_dtypes.pool_overrides`` puts
``upsample_linear_vec`` in the decomposition's place; sizes, source indices and the clamping at
the borders are torch's own helpers.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch._decomp.decompositions import _compute_scale, _compute_source_index, upsample_compute_output_size
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes, suggest_memory_format

aten = torch.ops.aten


def upsample_linear_vec(x: torch.Tensor, output_size: Any, align_corners: bool, scale_factors: Any) -> torch.Tensor:
    """``aten.upsample_{linear1d,bilinear2d,trilinear3d}.vec``: the output size from either
    argument, as ATen's composite computes it, then ``upsample_linear``."""
    size = upsample_compute_output_size(x.size(), output_size, scale_factors)
    return upsample_linear(x, size, align_corners, scale_factors or [None] * len(size))


def upsample_linear(x: torch.Tensor, size: list[Any], align_corners: bool, scales: list[Any]) -> torch.Tensor:
    """Each output the neighbours' sum weighted by (1 - w, w) along each spatial dim, the last dim
    combined first, as eager's kernels nest their loops."""
    _, dtype = elementwise_dtypes(x, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.INT_TO_FLOAT)
    # (indices, weights and sums in float32 for 16-bit inputs, rounded once: eager's opmath)
    math = torch.float64 if dtype == torch.float64 else torch.float32
    dims = len(size)
    lows, highs, weights = [], [], []
    for d, (n_in, n_out, scale) in enumerate(zip(x.shape[2:], size, scales)):
        factor = _compute_scale(n_in, n_out, align_corners, scale)
        src = _compute_source_index(factor, torch.arange(n_out, device=x.device).to(math), align_corners)
        src = src.clamp(min=0.0).reshape(-1, *[1] * (dims - 1 - d))
        low = src.to(torch.int64)
        lows.append(low)
        highs.append((low + 1).clamp(max=n_in - 1))
        weights.append((src - low).clamp(0.0, 1.0))
    corners = [aten._unsafe_index(x, [None, None, *[highs[d] if pick[d] else lows[d] for d in range(dims)]]).to(math)
               for pick in itertools.product((0, 1), repeat=dims)]
    for d in reversed(range(dims)):
        w = weights[d]
        corners = [a * (1 - w) + b * w for a, b in zip(corners[::2], corners[1::2])]
    (out,) = corners
    # (the layout and the integer rounding as torch's decomposition gives them)
    fmt = suggest_memory_format(x)
    if x.device.type == "cuda" and x.shape[1] < 16:
        fmt = torch.contiguous_format
    out = out.to(dtype).contiguous(memory_format=fmt)
    return out if x.is_floating_point() else out.round()
