"""Fake quantization and quantization-aware-training code compiled by ember, against eager."""

from __future__ import annotations

import pytest
import torch

from .helpers import assert_same, run


def _per_row_symmetric(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(1, keepdim=True) / 127
    return (x / scale).round().clamp(-127, 127)


def _with_zero_point(x: torch.Tensor) -> torch.Tensor:
    return (x / 0.7 + 128).round().clamp(0, 255).to(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", [_per_row_symmetric, _with_zero_point], ids=["scale_in_kernel", "zero_point"])
def test_16_bit_chain_under_a_rounding_is_rounded_per_op(fn, dtype):
    # eager rounds x / s to 16 bits before adding z or dividing by a 16-bit scale computed from a
    # reduction; ember rounded only round()'s own input, so levels differed by a whole step
    torch.manual_seed(0)
    x = (torch.randn(33, 65) * 10).to(dtype)
    out, _ = run(fn, x)
    ref = fn(x)
    assert out.dtype == ref.dtype
    assert torch.equal(out, ref), int((out != ref).sum())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_ops_and_their_gradients(dtype):
    torch.manual_seed(0)
    x = (torch.randn(4, 8) * 3).to(dtype)
    scale, zero = torch.rand(8) + 0.05, torch.randint(0, 10, (8,), dtype=torch.int32)

    def fn(x):
        a = torch.fake_quantize_per_tensor_affine(x, 0.1, 3, 0, 255)
        b = torch.fake_quantize_per_channel_affine(x, scale, zero, 1, -128, 127)
        return a * 2 + b

    xs = [x.clone().requires_grad_() for _ in range(2)]
    out, _ = run(fn, xs[0])
    ref = fn(xs[1])
    assert_same(out, ref)
    g = torch.randn_like(ref)
    assert_same(torch.autograd.grad(out, xs[0], g), torch.autograd.grad(ref, xs[1], g))
