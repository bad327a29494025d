"""How many rows a CUDA C++ column kernel's thread should take per loop step (EMBER_COLUMN_UNROLL,
codegen/cuda_prelude.py): a channels_last BatchNorm + ReLU training step at a ResNet-18's
shapes, its ember kernels' GPU time per step (profiler) at each setting, against float64 on the
same inputs, with ember-triton's and Inductor's kernels for scale. One device call:

    EMBER_AOT_CACHE=0 PYTHONPATH=. python bench/column_unroll_probe.py [--unrolls 4,8,16]
        [--only TEXT] [--per-output]

``--per-output``: each output's error (y, then the input's, weight's and bias's gradients), of
two calls, and of the channel sums alone (split column kernels with no BatchNorm around them),
split and with the slices forced to 1.

Each setting sets both the kernels' macro and the host's ``cuda.COLUMN_UNROLL`` (block sizes).
ReLU's kink: an output within rounding of 0 may fall on the other side of it than in float64
(sums added in another order), and its gradient then differs by the whole incoming gradient.
Errors count such elements ("flips") and leave them out of the input gradient's error; the
weight and bias gradients (sums over all elements) still carry them. Unroll 16 flipped one
element at the stem's f32 case (dx 4.5e-2, db 2.5e-4 before this rule; sixty-eighth session).
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


def _errors(got: list[torch.Tensor], ref: list[torch.Tensor]) -> list[float]:
    """Each output's largest error over its largest magnitude. For a step (y, dx, dw, db), dx
    only where y is on the same side of ReLU's kink as in float64."""
    errors = []
    for i, (g, r) in enumerate(zip(got, ref)):
        diff = (g.double() - r).abs()
        if i == 1 and len(got) == 4:
            diff = diff * ((got[0] > 0) == (ref[0] > 0))
        errors.append((diff.max() / r.abs().max().clamp_min(1e-30)).item())
    return errors


def _flips(got: list[torch.Tensor], ref: list[torch.Tensor]) -> int:
    """Outputs on the other side of ReLU's kink than in float64."""
    return int(((got[0] > 0) != (ref[0] > 0)).sum().item())


def _worst_error(got: list[torch.Tensor], ref: list[torch.Tensor]) -> str:
    flips = _flips(got, ref)
    return f"{max(_errors(got, ref)):.0e}" + (f", {flips} flip{'s' * (flips > 1)}" if flips else "")


def _set_unroll(unroll: int, base_prelude: str) -> None:
    cuda.PRELUDE = f"#define EMBER_COLUMN_UNROLL {unroll}\n" + base_prelude
    cuda.COLUMN_UNROLL = unroll


def _channel_sums(x: torch.Tensor) -> list[torch.Tensor]:
    return [x.float().sum((0, 2, 3)), (x.float() * x.float()).sum((0, 2, 3))]


def _per_output(args, seed, ref, unrolls: list[int], base_prelude: str, base_unroll: int) -> None:
    """Each output's error of two calls at each unroll; then the channel sums alone."""
    from ember.runtime import cuda_launch
    slices = cuda_launch.column_slices
    sums_ref = _channel_sums(args[0].detach().double())
    for unroll in unrolls:
        _set_unroll(unroll, base_prelude)
        fn = ember.compile(bn_relu, options={"gpu_backend": "cuda"})
        for call in (1, 2):
            fresh = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
            got = _step(fn, fresh, seed)
            print(f"  unroll {unroll} call {call}: y, dx, dw, db " + " ".join(f"{e:.1e}" for e in _errors(got, ref))
                  + f"; {_flips(got, ref)} flip(s)")
        torch._dynamo.reset()
        for split in (True, False):
            cuda_launch.column_slices = slices if split else (lambda *a: 1)
            sums = ember.compile(_channel_sums, options={"gpu_backend": "cuda"})(args[0].detach())
            print(f"  unroll {unroll} channel sums, {'split' if split else 'unsplit'}: "
                  + " ".join(f"{e:.1e}" for e in _errors(sums, sums_ref)))
            torch._dynamo.reset()
        cuda_launch.column_slices = slices
    _set_unroll(base_unroll, base_prelude)


def _measure(fn, args, seed, ref) -> tuple[float, str]:
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
    ap.add_argument("--only", default="", help="cases whose label contains this text")
    ap.add_argument("--per-output", action="store_true")
    args_ = ap.parse_args()
    unrolls = [int(u) for u in args_.unrolls.split(",")]
    base_prelude, base_unroll = cuda.PRELUDE, cuda.COLUMN_UNROLL
    rows = []
    for dtype, c, side in CASES:
        label = f"{args_.batch}x{c}x{side}x{side} {str(dtype).split('.')[-1]} NHWC"
        if args_.only not in label:
            continue
        args = _inputs(c, side, args_.batch, dtype, True, "cuda")
        seed = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
        seed = seed.contiguous(memory_format=torch.channels_last)
        ref = _step(bn_relu, [a.detach().double().requires_grad_(a.requires_grad) for a in args], seed.double())
        if args_.per_output:
            print(label)
            _per_output(args, seed, ref, unrolls, base_prelude, base_unroll)
            continue
        cells = []
        eager_error = _worst_error(_step(bn_relu, [a.detach().clone().requires_grad_(a.requires_grad)
                                                  for a in args], seed), ref)
        for fn in (torch.compile(bn_relu, dynamic=False), ember.compile(bn_relu, options={"gpu_backend": "triton"})):
            us, error = _measure(fn, args, seed, ref)
            cells.append(f"{us:.0f} ({error})")
            torch._dynamo.reset()
        for unroll in unrolls:
            _set_unroll(unroll, base_prelude)
            us, error = _measure(ember.compile(bn_relu, options={"gpu_backend": "cuda"}), args, seed, ref)
            cells.append(f"{us:.0f} ({error})")
            torch._dynamo.reset()
        _set_unroll(base_unroll, base_prelude)
        rows.append([label, eager_error, *cells])
    if args_.per_output:
        return
    print("own kernels' GPU µs a step (worst error against float64, relative to the output's largest value)")
    print(table(rows, ["case", "eager err", "inductor", "ember-triton", *(f"ember-cuda unroll {u}" for u in unrolls)]))


if __name__ == "__main__":
    main()
