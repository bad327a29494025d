"""How many rows a CUDA C++ column kernel's thread should take per loop step (EMBER_COLUMN_UNROLL,
codegen/cuda_prelude.py): a channels_last BatchNorm + ReLU training step at a ResNet-18's
shapes, its ember kernels' GPU time per step (profiler) at each setting, against float64 on the
same inputs, with ember-triton's and Inductor's kernels for scale. One device call:

    EMBER_AOT_CACHE=0 PYTHONPATH=. python bench/column_unroll_probe.py [--unrolls 4,8,16]
"""

from __future__ import annotations

import argparse

import torch

import ember
import ember.codegen.cuda as cuda
from bench.batchnorm import _inputs, _step, bn_relu
from bench.common import profiled_kernels, table

CASES = [(torch.bfloat16, 64, 112), (torch.bfloat16, 64, 56), (torch.bfloat16, 128, 28), (torch.bfloat16, 256, 14),
         (torch.float32, 64, 112)]


def _worst_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """The worst output's largest error over its largest magnitude."""
    return max(((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for g, r in zip(got, ref))


def _measure(fn, args, seed, ref) -> tuple[float, float]:
    fresh = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    error = _worst_error(_step(fn, fresh, seed), ref)
    if hasattr(ember, "wait_for_kernels"):
        ember.wait_for_kernels()
    kernels = profiled_kernels(lambda: _step(fn, args, seed), n=10)
    # the compiler's own kernels (not cuDNN's, ATen's copies or memsets)
    own = sum(us for name, us in kernels.items() if name.startswith(("fused_", "triton_")))
    return own, error


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--unrolls", default="4,8,16")
    ap.add_argument("--batch", type=int, default=64)
    args_ = ap.parse_args()
    unrolls = [int(u) for u in args_.unrolls.split(",")]
    base_prelude = cuda.PRELUDE
    rows = []
    for dtype, c, side in CASES:
        args = _inputs(c, side, args_.batch, dtype, True, "cuda")
        seed = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
        seed = seed.contiguous(memory_format=torch.channels_last)
        ref = _step(bn_relu, [a.detach().double().requires_grad_(a.requires_grad) for a in args], seed.double())
        cells = []
        eager_error = _worst_error(_step(bn_relu, [a.detach().clone().requires_grad_(a.requires_grad)
                                                  for a in args], seed), ref)
        for fn in (torch.compile(bn_relu, dynamic=False), ember.compile(bn_relu, options={"gpu_backend": "triton"})):
            us, error = _measure(fn, args, seed, ref)
            cells.append(f"{us:.0f} ({error:.0e})")
            torch._dynamo.reset()
        for unroll in unrolls:
            cuda.PRELUDE = f"#define EMBER_COLUMN_UNROLL {unroll}\n" + base_prelude
            us, error = _measure(ember.compile(bn_relu, options={"gpu_backend": "cuda"}), args, seed, ref)
            cells.append(f"{us:.0f} ({error:.0e})")
            torch._dynamo.reset()
        cuda.PRELUDE = base_prelude
        rows.append([f"{args_.batch}x{c}x{side}x{side} {str(dtype).split('.')[-1]} NHWC", f"{eager_error:.0e}", *cells])
    print("own kernels' GPU µs a step (worst error against float64, relative to the output's largest value)")
    print(table(rows, ["case", "eager err", "inductor", "ember-triton", *(f"ember-cuda unroll {u}" for u in unrolls)]))


if __name__ == "__main__":
    main()
