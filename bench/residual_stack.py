"""A pre-norm residual stack, x = x + linear(gelu(norm(x))) per layer: what a stored residual stream saves.

The sum x_k = x + h_1 + ... + h_k (h_i a block's matmul) feeds layer k's norm and the next layer's sum. When ember
recomputed it in both, layer k's norm kernel read the input and every block output before it
(up to ``max_recompute_ops`` adds); the planner now stores a shared value whose recomputation
reads more than ``max_recompute_reads`` full-size buffers. The old rule is timed too, in the
same run, through ``options={"max_recompute_reads": 1000}``.

For each variant: the relative error of the forward against a float64 model, then the forward
and a training step (forward + backward) timed, and the device time of the forward's kernels.
GPU: CUDA events, medians of interleaved rounds; CPU: median wall times.

    PYTHONPATH=. python bench/residual_stack.py [--device cuda] [--dtype bf16] [--layers 8]
                                                 [--rows 16384] [--width 1024] [--backends triton,cuda]
                                                 [--profile N]
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn

import ember
from bench.common import machine, median_times, rel_error, table

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


class Stack(nn.Module):
    def __init__(self, layers: int, width: int):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.linears = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, linear in zip(self.norms, self.linears):
            x = x + linear(F.gelu(norm(x)))
        return x


def _times(variants: dict, device: str, reps: int) -> dict[str, float]:
    """ms per call of each variant."""
    if device == "cuda":
        from bench.common import interleaved_gpu_times
        return interleaved_gpu_times(variants, rounds=5)
    return {k: v * 1e3 for k, v in median_times(variants, reps=reps).items()}


def _kernels(fn, device: str) -> dict[str, float]:
    """Device µs per call of each kernel the forward launches (none measured on the CPU)."""
    if device != "cuda":
        return {}
    from bench.common import profiled_kernels
    return profiled_kernels(fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--backends", default="triton", help="ember GPU backends, e.g. triton,cuda")
    ap.add_argument("--profile", type=int, default=0, help="print each variant's N costliest forward kernels")
    args = ap.parse_args()
    dtype, device = DTYPES[args.dtype], args.device
    torch.manual_seed(0)
    model = Stack(args.layers, args.width).to(device, dtype)
    x = torch.randn(args.rows, args.width, device=device, dtype=dtype)
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double())

    # one forward compiled by up to five backends, each with and without gradients
    torch._dynamo.config.recompile_limit = 64
    compiled = {"eager": model, "inductor": torch.compile(copy.deepcopy(model))}
    for backend in args.backends.split(",") if device == "cuda" else ["cpp"]:
        gpu = {"gpu_backend": backend} if device == "cuda" else {}
        compiled[f"ember-{backend}"] = ember.compile(copy.deepcopy(model), options=gpu)
        compiled[f"ember-{backend}, summed again"] = ember.compile(
            copy.deepcopy(model), options={**gpu, "max_recompute_reads": 1000})

    def forward(fn):
        def run():
            with torch.no_grad():
                return fn(x)
        return run

    xg = x.clone().requires_grad_(True)

    def step(fn):
        return lambda: fn(xg).float().square().mean().backward()

    errors = {name: rel_error(forward(fn)(), ref) for name, fn in compiled.items()}
    for fn in compiled.values():
        step(fn)()
    fwd = _times({k: forward(fn) for k, fn in compiled.items()}, device, args.reps)
    train = _times({k: step(fn) for k, fn in compiled.items()}, device, args.reps)
    kernels = {name: _kernels(forward(fn), device) for name, fn in compiled.items()}
    rows = [[name, f"{errors[name]:.1e}", f"{fwd[name]:.3f}", f"{fwd['inductor'] / fwd[name]:.2f}x",
             f"{train[name]:.3f}", f"{train['inductor'] / train[name]:.2f}x",
             f"{sum(kernels[name].values()):.1f}" if kernels[name] else "-"]
            for name, fn in compiled.items()]
    print(f"{machine()}; {args.layers} layers, {args.rows} x {args.width} {args.dtype}")
    print(table(rows, ["variant", "rel err", "fwd ms", "vs Inductor", "fwd+bwd ms", "vs Inductor",
                       "fwd kernel µs"]))
    for name in compiled if args.profile else ():
        top = sorted(kernels[name].items(), key=lambda kv: -kv[1])[:args.profile]
        print(f"{name}: " + "; ".join(f"{k} {us:.1f} µs" for k, us in top))


if __name__ == "__main__":
    main()
