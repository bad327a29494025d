"""A pre-norm residual stack, x = x + f(norm(x)) per layer: what a stored residual stream saves.

The sum x_k = x + f_1 + ... + f_k feeds layer k's norm and the next layer's sum. When ember
recomputed it in both, layer k's norm kernel read the input and every block output before it
(up to ``max_recompute_ops`` adds); the planner now stores a shared value whose recomputation
reads more than ``max_recompute_reads`` full-size buffers. The old rule is timed too, in the
same run, through ``options={"max_recompute_reads": 1000}``.

For each variant: the relative error of the forward against a float64 model, then the forward
and a training step (forward + backward) timed, and the device time of the forward's kernels.
GPU: CUDA events, medians of interleaved rounds; CPU: median wall times.

    PYTHONPATH=. python bench/residual_stack.py [--device cuda] [--dtype bf16] [--layers 8]
                                                 [--rows 16384] [--width 1024] [--backends triton,cuda]
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
            x = x + F.gelu(linear(norm(x)))
        return x


def _times(variants: dict, device: str, reps: int) -> dict[str, float]:
    """ms per call of each variant."""
    if device == "cuda":
        from bench.common import interleaved_gpu_times
        return interleaved_gpu_times(variants, rounds=5)
    return {k: v * 1e3 for k, v in median_times(variants, reps=reps).items()}


def _kernel_us(fn, device: str) -> str:
    if device != "cuda":
        return "-"
    from bench.common import profiled_kernels
    return f"{sum(profiled_kernels(fn).values()):.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--backends", default="triton", help="ember GPU backends, e.g. triton,cuda")
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
    rows = [[name, f"{errors[name]:.1e}", f"{fwd[name]:.3f}", f"{fwd['inductor'] / fwd[name]:.2f}x",
             f"{train[name]:.3f}", f"{train['inductor'] / train[name]:.2f}x", _kernel_us(forward(fn), device)]
            for name, fn in compiled.items()]
    print(f"{machine()}; {args.layers} layers, {args.rows} x {args.width} {args.dtype}")
    print(table(rows, ["variant", "rel err", "fwd ms", "vs Inductor", "fwd+bwd ms", "vs Inductor",
                       "fwd kernel µs"]))


if __name__ == "__main__":
    main()
