"""BatchNorm2d + ReLU training steps at a ResNet-18's shapes: eager vs Inductor vs ember.

A training-mode BatchNorm reduces each channel over N x H x W: few rows (64-512 channels), long
ones (up to 800K elements). One program per channel leaves most of a GPU idle, so ember plans the
statistics as reductions of their own, split over programs, and the normalization as a pointwise
kernel (schedule/domains.py: few_long_rows). Each case: the output and the input, weight and
bias gradients against eager's (float64 for float32 inputs), then medians of interleaved rounds
of a step (forward + backward, CUDA events on the GPU, wall time on the CPU). One device call:

    python bench/batchnorm.py [--device cuda|cpu] [--backends triton,cuda] [--batch N] [--only TEXT]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, machine, median_times, rel_error, table  # noqa: E402

import ember  # noqa: E402

# (channels, side) of a ResNet-18's BatchNorms at 224 x 224: the stem's, then each stage's
SHAPES = [(64, 112), (64, 56), (128, 28), (256, 14), (512, 7)]


def bn_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, mean: torch.Tensor,
            var: torch.Tensor) -> torch.Tensor:
    return torch.relu(F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5))


def _inputs(c: int, side: int, batch: int, dtype: torch.dtype, channels_last: bool, device: str
            ) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(c * side)
    x = (torch.randn(batch, c, side, side, generator=g) * 2 + 0.5).to(device=device, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (torch.rand(c, generator=g) + 0.5).to(device)
    bias = torch.randn(c, generator=g).to(device)
    return [x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_(),
            torch.zeros(c, device=device), torch.ones(c, device=device)]


def _step(fn: Callable[..., torch.Tensor], args: list[torch.Tensor], seed: torch.Tensor) -> list[torch.Tensor]:
    out = fn(*args)
    grads = torch.autograd.grad(out, args[:3], seed)
    return [out, *grads]


def _case(c: int, side: int, batch: int, dtype: torch.dtype, channels_last: bool, device: str,
          backends: list[str]) -> list[str]:
    args = _inputs(c, side, batch, dtype, channels_last, device)
    seed = torch.randn(args[0].shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    seed = seed.contiguous(memory_format=torch.channels_last) if channels_last else seed
    fns: dict[str, Callable[..., torch.Tensor]] = {"eager": bn_relu,
                                                   "inductor": torch.compile(bn_relu, dynamic=False)}
    for b in backends:
        fns[f"ember-{b}" if device == "cuda" else "ember"] = ember.compile(
            bn_relu, options={"gpu_backend": b} if device == "cuda" else None)
    # reference: eager in float64 (float32 inputs), else eager itself
    if dtype == torch.float32:
        ref_args = [a.detach().double().requires_grad_(a.requires_grad) for a in args]
        ref = _step(bn_relu, ref_args, seed.double())
    else:
        ref = _step(bn_relu, args, seed)
    errors, kernels = {}, {}
    for name, fn in fns.items():
        fresh = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        if name.startswith("ember"):
            before = ember.stats().get("kernels_generated", 0)
        got = _step(fn, fresh, seed)
        if name.startswith("ember"):
            kernels[name] = ember.stats().get("kernels_generated", 0) - before
        errors[name] = max(rel_error(a.double(), b.double()) for a, b in zip(got, ref))
    if device == "cuda" and hasattr(ember, "wait_for_kernels"):
        ember.wait_for_kernels()
    variants = {n: (lambda fn=fn: _step(fn, args, seed)) for n, fn in fns.items()}
    # µs a step
    times = ({n: ms * 1e3 for n, ms in interleaved_gpu_times(variants).items()} if device == "cuda"
             else {n: s * 1e6 for n, s in median_times(variants, reps=20).items()})
    base = times["inductor"]
    label = f"{batch}x{c}x{side}x{side} {str(dtype).split('.')[-1]}{' NHWC' if channels_last else ''}"
    cells = [f"{times[n]:.0f} ({base / times[n]:.2f}x)" for n in fns]
    return [label, *cells, " / ".join(f"{errors[n]:.0e}" for n in fns), " / ".join(str(kernels[n]) for n in kernels)]


def run(device: str, backends: list[str], batch: int, only: str = "") -> str:
    rows, names = [], ["eager", "inductor", *(f"ember-{b}" if device == "cuda" else "ember" for b in backends)]
    for dtype, channels_last in ((torch.float32, False), (torch.bfloat16, True)):
        for c, side in SHAPES:
            if device == "cpu":
                side = max(1, side // 4)
            label = f"{c}x{side} {dtype} {channels_last}"
            if only and only not in label:
                continue
            rows.append(_case(c, side, batch, dtype, channels_last, device, backends))
            torch._dynamo.reset()
    return table(rows, ["case (N x C x H x W)", *[f"{n} µs (vs Inductor)" for n in names], "rel err, in that order",
                        "ember kernels a compile"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backends", default="triton,cuda", help="ember's GPU backends (cuda device only)")
    ap.add_argument("--batch", type=int, default=None, help="images a batch (default 64 on cuda, 8 on cpu)")
    ap.add_argument("--only", default="", help="cases whose label contains this text")
    a = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    backends = a.backends.split(",") if a.device == "cuda" else ["cpp"]
    batch = a.batch or (64 if a.device == "cuda" else 8)
    print(machine())
    print(run(a.device, backends, batch, a.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
