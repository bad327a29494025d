"""float16 and bfloat16 tensors on the CPU backend: results as eager's, found by a bug hunt."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from .helpers import check

HALF = [torch.float16, torch.bfloat16]


def test_isnan_of_a_chain_that_overflows_in_float16():
    # eager rounds each op: 1000 * 100 is inf in float16, and inf - inf is NaN
    x = torch.tensor([1000.0, -3.0, 0.5, 700.0, -900.0], dtype=torch.float16)
    check(lambda a: (a * 100 - a * 100).isnan(), x)
    check(lambda a: torch.nan_to_num(a * 100 - a * 100, nan=7.0), x)


def test_huber_and_soft_margin_losses_take_the_inputs_dtype():
    # eager's kernels write the elementwise loss into a tensor like the input (then reduce it)
    x = torch.randn(7, 33, dtype=torch.float16)
    t32, t16 = torch.randn(7, 33), torch.randn(7, 33, dtype=torch.bfloat16)
    check(lambda a, b: F.huber_loss(a, b, delta=0.5), x, t32)
    check(lambda a, b: F.huber_loss(a, b, reduction="none"), x, t16)
    check(lambda a, b: F.soft_margin_loss(a, b.sign(), reduction="sum"), x, t32)
    check(lambda a, b: F.huber_loss(a, b), t32, t32.double())


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_values_a_jump_reads_from_a_buffer_are_rounded_as_eager_holds_them(dtype):
    # values rounded once instead of op by op are an ulp off here and there: a sort or a
    # max_pool of them orders ties otherwise, and a comparison in the next kernel gives other bools
    torch.manual_seed(0)
    x = torch.randn(16, 300).to(dtype)
    y = x.flip(1)
    check(lambda a, b: (torch.sort(a * b + a, 1), torch.topk(a * b - b, 50, 1)), x, y)
    check(lambda a, b: F.max_pool1d((a * b + a).unsqueeze(0), 3, 2, return_indices=True), x, y)
    check(lambda a, b: (a * b + a, (a * b + a).t().contiguous() > 0.25), x, y)
