"""Weight gradients of CPU bfloat16 convolutions: taps that meet no input are 0 (conv_grads.py)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.frontend.conv_grads import _mask_of_dim, _taps_meeting_input


def _enumerated(size: int, out: int, k: int, stride: int, pad: int, dil: int) -> list[bool]:
    return [any(0 <= o * stride + t * dil - pad < size for o in range(out)) for t in range(k)]


@pytest.mark.parametrize("stride,pad,dil", list(itertools.product((1, 2, 3), (0, 1, 2, 4), (1, 2))))
def test_taps_meeting_the_input_as_every_output_position_reads_them(stride, pad, dil):
    for size, k in itertools.product((1, 2, 3, 5, 8), (1, 2, 3, 5)):
        out = (size + 2 * pad - dil * (k - 1) - 1) // stride + 1
        if out <= 0:
            continue
        want = _enumerated(size, out, k, stride, pad, dil)
        assert _taps_meeting_input(size, out, k, stride, pad, dil) == want, (size, k)
        assert _mask_of_dim(size, out, k, stride, pad, dil, torch.device("cpu")).tolist() == want, (size, k)


GEOMETRIES = {  # input, weight, stride, padding: the outer taps of the short dim meet only padding
    "conv2d_width_1": ((2, 33, 17, 1), (4, 33, 3, 3), 2, 1),
    "conv2d_1x1_input": ((2, 33, 1, 1), (4, 33, 3, 3), 3, 1),
    "conv1d_length_1": ((2, 33, 1), (4, 33, 3), 3, 1),
    "conv2d_width_2": ((2, 33, 9, 2), (4, 33, 3, 3), 3, 1),
}


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    conv = F.conv1d if x.dim() == 3 else F.conv2d
    return conv(x, w, b, stride=stride, padding=padding)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", list(GEOMETRIES))
def test_bf16_weight_gradients_of_taps_over_padding_are_zero(case, dynamic):
    """oneDNN's bfloat16 backward left those taps unwritten (whatever the allocator handed back:
    1e24-1e38, NaN, a different answer each call); the gradients match float64's."""
    xs, ws, stride, padding = GEOMETRIES[case]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(xs, generator=gen).bfloat16().requires_grad_()
    w = torch.randn(ws, generator=gen).bfloat16().requires_grad_()
    b = torch.randn(ws[0], generator=gen).bfloat16().requires_grad_()
    up = torch.randn(_conv(x, w, b, stride, padding).shape, generator=gen)
    refs = torch.autograd.grad(_conv(x.double(), w.double(), b.double(), stride, padding), [x, w, b], up.double())
    compiled = ember.compile(lambda x, w, b: _conv(x, w, b, stride, padding), dynamic=dynamic)
    for _ in range(3):
        torch.full((1 << 16,), float("nan"), dtype=torch.bfloat16)  # (freed at once: memory full of NaN)
        grads = torch.autograd.grad(compiled(x, w, b), [x, w, b], up.bfloat16())
        for got, ref in zip(grads, refs):
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=4e-2 * ref.float().abs().max().item())


def _backward_kernels(xs: tuple[int, ...], ws: tuple[int, ...], stride: int, padding: int,
                      dtype: torch.dtype) -> list[ember.KernelReport]:
    torch._dynamo.reset()  # (sizes that changed since the last call would be symbolic: always masked)
    report = ember.Report()
    x = torch.randn(xs, dtype=dtype, requires_grad=True)
    w = torch.randn(ws, dtype=dtype, requires_grad=True)
    compiled = ember.compile(lambda x, w: _conv(x, w, None, stride, padding).sum(), report=report)
    compiled(x, w).backward()
    return [k for g in report.graphs if g.kind == "backward" for k in g.kernels]


def test_the_mask_is_there_only_where_a_tap_meets_no_input():
    """Graphs, whatever this CPU's oneDNN does: a kernel after the ATen call that zeroes the
    weight gradient's taps for bfloat16 with a tap over padding only; none where every tap meets
    the input, and none for float32 (whose kernels write every tap)."""
    def wheres(kernels: list[ember.KernelReport]) -> int:  # (the mask's ops are the op's own)
        return sum(k.aten_ops == ["aten.convolution_backward"] for k in kernels)

    assert wheres(_backward_kernels((2, 33, 17, 1), (4, 33, 3, 3), 2, 1, torch.bfloat16)) == 1
    assert wheres(_backward_kernels((2, 33, 17, 5), (4, 33, 3, 3), 2, 1, torch.bfloat16)) == 0
    assert wheres(_backward_kernels((2, 33, 17, 1), (4, 33, 3, 3), 2, 1, torch.float32)) == 0
