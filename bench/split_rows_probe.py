"""Accuracy probe for row kernels split over blocks (CUDA C++: codegen/cuda_plan.py split_rows):
a BatchNorm + ReLU training step and a BatchNorm's channel sums, against float64 on the same
inputs, for eager, ember-cuda with and without the split, and ember-triton. Prints each
output's worst error relative to its largest magnitude.
    PYTHONPATH=. python bench/split_rows_probe.py"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import ember
from ember.runtime import cuda_launch


def bn_relu_with_grads(x, w, b, rm, rv, g):
    y = torch.relu(F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5))
    return (y, rm, rv, *torch.autograd.grad(y, (x, w, b), g))


def channel_sums(x):
    return x.float().sum((0, 2, 3)), (x.float() * x.float()).sum((0, 2, 3))


def _inputs(args, grads, to=None):
    """Fresh leaves of ``args`` (the first ``grads`` asking for gradients), in ``to`` if given."""
    return [a.detach().clone().to(to or a.dtype).requires_grad_(i < grads) for i, a in enumerate(args)]


def main() -> None:
    split_slices = cuda_launch.row_slices
    variants = {
        "eager": lambda fn: fn,
        "ember-cuda": lambda fn: ember.compile(fn, options={"gpu_backend": "cuda"}),
        "ember-cuda unsplit": lambda fn: ember.compile(fn, options={"gpu_backend": "cuda"}),
        "ember-triton": lambda fn: ember.compile(fn, options={"gpu_backend": "triton"}),
    }
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(32, 64, 56, 56, device="cuda", generator=gen) * 2 + 0.5).to(dtype)
        w, b = torch.rand(64, device="cuda", generator=gen) + 0.5, torch.randn(64, device="cuda", generator=gen)
        g = torch.randn(x.shape, device="cuda", generator=gen).to(dtype)
        args = (x, w, b, torch.zeros(64, device="cuda"), torch.ones(64, device="cuda"), g)
        for fn, fn_args, grads in ((bn_relu_with_grads, args, 3), (channel_sums, args[:1], 0)):
            reference = fn(*_inputs(fn_args, grads, torch.float64))
            print(f"{fn.__name__} {dtype}: worst error of each output / its largest magnitude")
            for name, make in variants.items():
                cuda_launch.row_slices = (lambda *a: 1) if name.endswith("unsplit") else split_slices
                torch._dynamo.reset()
                out = make(fn)(*_inputs(fn_args, grads))
                errors = [((o.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
                          for o, r in zip(out, reference)]
                print(f"  {name:20s} " + " ".join(f"{e:8.1e}" for e in errors))
    cuda_launch.row_slices = split_slices


if __name__ == "__main__":
    main()
