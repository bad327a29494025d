"""Weight gradients of CPU bfloat16 convolutions, with the taps that meet no input set to 0.

oneDNN's bfloat16 ``convolution_backward`` on the CPU leaves some weight-gradient taps unwritten:
those that only ever fall on padding or past the input's end. With a stride above 1, a 3x3 kernel
over a width-1 input (padding 1) got whatever memory the allocator handed back in its outer two
columns (1e24 to 1e38, NaN), a different answer on each call, in eager and in every compiler that
calls the op (CPU fuzz seed 818613715547; torch 2.13.0+cpu on an AMD EPYC). float32 and
float16, and the same call with mkldnn off, give 0 there, as the true gradient is: such a tap
multiplies nothing but zeros.

ember keeps the ATen call and writes 0 into those taps after it. A tap ``k`` of a spatial dim
(input size ``H``, output size ``O``, stride ``s``, padding ``p``, dilation ``d``) meets the input
when some output position ``o`` in ``[0, O)`` reads ``0 <= o*s + k*d - p < H``. With static sizes
the taps are known while tracing, and a kernel whose every tap meets the input (nearly all) keeps
the call as it is; with symbolic sizes the mask is computed in the graph from the sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

_inside = [False]  # (the decomposition calls the op it stands for: that call keeps the op)


def _taps_meeting_input(size: int, out: int, k: int, stride: int, pad: int, dil: int) -> list[bool]:
    """Static sizes: which of the ``k`` taps some output position reads inside the input."""
    taps = []
    for t in range(k):
        a = t * dil - pad
        first = max(0, -(a // stride))      # the first o with o*s + a >= 0 (ceil(-a / s))
        last = min(out - 1, (size - 1 - a) // stride)  # the last o with o*s + a <= size - 1
        taps.append(first <= last)
    return taps


def _mask_of_dim(size: Any, out: Any, k: Any, stride: Any, pad: Any, dil: Any, device: torch.device) -> torch.Tensor:
    """The same, as a bool tensor of ``k`` computed in the graph (symbolic sizes)."""
    a = torch.arange(k, device=device) * dil - pad
    first = -torch.div(a, stride, rounding_mode="floor")
    last = torch.div((size - 1) - a, stride, rounding_mode="floor")
    return (first <= last) & (last >= 0) & (first <= out - 1)


def _static(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _weight_taps_zeroed(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any,
                        dilation: Any, transposed: bool, output_mask: Any) -> torch.Tensor | None:
    """A bool mask over the weight (1, 1, *kernel) of the taps that meet the input, or None where
    every tap does or the call is not one oneDNN computes so."""
    if (_inside[0] or transposed or x.device.type != "cpu" or weight.dtype != torch.bfloat16
            or not output_mask[1] or weight.dim() < 3):
        return None
    nd = weight.dim() - 2
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    sizes, outs, kernel = list(x.shape[2:]), list(grad_out.shape[2:]), list(weight.shape[2:])
    if all(_static(v) for v in (*sizes, *outs, *kernel, *stride, *padding, *dilation)):
        taps = [_taps_meeting_input(*dims) for dims in zip(sizes, outs, kernel, stride, padding, dilation)]
        if all(all(t) for t in taps):
            return None
    mask = None
    for i, dims in enumerate(zip(sizes, outs, kernel, stride, padding, dilation)):
        m = _mask_of_dim(*dims, device=weight.device).view([1] * (2 + i) + [-1] + [1] * (nd - 1 - i))
        mask = m if mask is None else mask & m
    return mask


def _convolution_backward(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_sizes: Any,
                          stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                          groups: Any, output_mask: Any) -> Any:
    mask = _weight_taps_zeroed(grad_out, x, weight, stride, padding, dilation, transposed, output_mask)
    if mask is None:
        return NotImplemented  # (the op, as eager calls it)
    _inside[0] = True
    try:
        gx, gw, gb = aten.convolution_backward.default(grad_out, x, weight, bias_sizes, stride, padding, dilation,
                                                       transposed, output_padding, groups, output_mask)
    finally:
        _inside[0] = False
    return gx, torch.where(mask, gw, 0.0), gb


def conv_grad_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition above, by the op it stands for."""
    return {aten.convolution_backward.default: _convolution_backward}
