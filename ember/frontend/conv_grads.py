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

import operator
import threading
from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten

_state = threading.local()  # (inside: the decomposition calls the op it stands for, kept as it is)


def _meets_input(a: Any, size: Any, out: Any, stride: Any, floor_div: Callable[[Any, Any], Any]) -> Any:
    """Whether the tap at offset ``a = tap * dilation - padding`` meets the input: some output
    position o in [0, out) reads o * stride + a in [0, size). Of ints (a bool) or of a tensor of
    offsets (a bool tensor, symbolic sizes)."""
    first = -floor_div(a, stride)                # the first o with o * stride + a >= 0
    last = floor_div((size - 1) - a, stride)     # the last o with o * stride + a <= size - 1
    return (first <= last) & (last >= 0) & (first <= out - 1)


def _taps_meeting_input(size: int, out: int, k: int, stride: int, pad: int, dil: int) -> list[bool]:
    """Static sizes: which of the ``k`` taps meet the input."""
    return [bool(_meets_input(t * dil - pad, size, out, stride, operator.floordiv)) for t in range(k)]


def _mask_of_dim(size: Any, out: Any, k: Any, stride: Any, pad: Any, dil: Any, device: torch.device) -> torch.Tensor:
    """The same, as a bool tensor of ``k`` computed in the graph (symbolic sizes)."""
    return _meets_input(torch.arange(k, device=device) * dil - pad, size, out, stride,
                        lambda a, s: torch.div(a, s, rounding_mode="floor"))


def _static(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _meeting_taps_mask(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any,
                        dilation: Any, transposed: bool, output_mask: Any) -> torch.Tensor | None:
    """A bool mask over the weight (1, 1, *kernel) of the taps that meet the input, or None where
    every tap does or the call is not one oneDNN computes so."""
    if (getattr(_state, "inside", False) or transposed or x.device.type != "cpu" or weight.dtype != torch.bfloat16
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
    mask = _meeting_taps_mask(grad_out, x, weight, stride, padding, dilation, transposed, output_mask)
    if mask is None:
        return NotImplemented  # (the op, as eager calls it)
    _state.inside = True
    try:
        gx, gw, gb = aten.convolution_backward.default(grad_out, x, weight, bias_sizes, stride, padding, dilation,
                                                       transposed, output_padding, groups, output_mask)
    finally:
        _state.inside = False
    return gx, torch.where(mask, gw, 0.0), gb


def conv_grad_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition above, by the op it stands for."""
    return {aten.convolution_backward.default: _convolution_backward}
