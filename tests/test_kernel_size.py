"""A value inlined at many points is stored once where recomputing it would make most of a
kernel (schedule/build.py: MAX_KERNEL_VALUES).

Found by the GPU fuzzer: a layer norm read through a circular pad by a 3x3 average pool was
recomputed at 81 points, one kernel of 738 values (1500 lines of Triton) that ptxas took 70-90 s
to compile on an H100, again for each new size's launch configuration. The pad's result now has
a buffer of its own; the kernels stay small and the results eager's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.schedule import build

from .conftest import DEVICE
from .helpers import assert_same


def _norm_pad_pool(x, w, b):
    y = F.layer_norm(x, (x.shape[-1],), w, b)
    y = F.pad(y, (0, 2, 0, 2), mode="circular")
    return F.avg_pool2d(y, 3, stride=1, padding=1, ceil_mode=True, count_include_pad=True)


def _values(kernel: ember.KernelReport) -> int:
    return sum(1 for line in kernel.kernel_ir.splitlines() if line.startswith("  v"))


def _compiled_sizes(x, w, b):
    """Forward and gradients of ember's _norm_pad_pool against eager's; the kernels' sizes."""
    args = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    ref = [t.detach().clone().requires_grad_(True) for t in (x, w, b)]
    report = ember.Report()
    torch._dynamo.reset()
    out = ember.compile(_norm_pad_pool, report=report, options={"aot_cache": False})(*args)
    expected = _norm_pad_pool(*ref)
    up = torch.randn_like(expected)
    out.backward(up)
    expected.backward(up)
    assert_same(out, expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(args, ref):
        assert_same(got.grad, want.grad, rtol=1e-4, atol=1e-4)
    return [_values(k) for k in report.kernels]


@pytest.mark.usefixtures("padded_on_cpu")
def test_a_value_recomputed_at_most_of_a_kernels_points_gets_a_buffer(monkeypatch):
    x, w, b = torch.randn(2, 3, 3, 64, device=DEVICE), torch.randn(64, device=DEVICE), torch.randn(64, device=DEVICE)
    sizes = _compiled_sizes(x, w, b)
    assert max(sizes) <= build.MAX_KERNEL_VALUES, sizes
    monkeypatch.setattr(build, "MAX_KERNEL_VALUES", 10**9)  # every value inlined, as before
    unbounded = _compiled_sizes(x, w, b)
    assert max(unbounded) > 2 * max(sizes), (sizes, unbounded)
    assert len(sizes) > len(unbounded)  # (the pad's own kernels)
