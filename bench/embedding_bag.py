"""embedding_bag (nn.EmbeddingBag): eager vs Inductor vs ember, forward and training step.

Recommendation models' bags of sparse features: a table's rows gathered at a batch's indices and
summed (or averaged) per bag. Each case: correctness of the output and of the weight's (and the
per-sample weights') gradients against a float64 reference, kernels and ATen calls per graph, then
medians of interleaved rounds (CUDA events on the GPU, wall time on the CPU). One device call:

    python bench/embedding_bag.py [--device cuda|cpu] [--backends triton,cuda] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, machine, median_times, rel_error, table  # noqa: E402

import ember  # noqa: E402


def weighted_sum(weight, per_sample, indices, offsets):
    return F.embedding_bag(indices, weight, offsets, mode="sum", per_sample_weights=per_sample)


def padded_mean(weight, per_sample, indices, offsets):
    return F.embedding_bag(indices, weight, offsets, mode="mean", padding_idx=0)


def fixed_mean(weight, per_sample, indices, offsets):
    return F.embedding_bag(indices, weight, mode="mean")  # (B, N) indices: bags of N


def cases(scale: float, device: str) -> dict[str, tuple[Callable[..., torch.Tensor], tuple[Any, ...]]]:
    g = torch.Generator().manual_seed(0)
    rows, bags = max(int(262144 * scale), 64), max(int(8192 * scale), 4)
    lengths = torch.randint(1, 65, (bags,), generator=g)  # 1..64 indices a bag
    total = int(lengths.sum())
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)[:-1]]).to(device)
    indices = torch.randint(0, rows, (total,), generator=g).to(device)
    per_sample = torch.rand(total, generator=g).to(device)
    fixed = torch.randint(0, rows, (bags, 32), generator=g).to(device)

    def table_of(dtype):
        return (torch.randn(rows, 128, generator=g) * 0.1).to(device=device, dtype=dtype)

    return {
        "sum, per-sample weights, f32": (weighted_sum, (table_of(torch.float32), per_sample, indices, offsets)),
        "mean, padding_idx, bf16": (padded_mean, (table_of(torch.bfloat16), None, indices, offsets)),
        "mean, bags of 32, f32": (fixed_mean, (table_of(torch.float32), None, fixed, None)),
    }


def _leaves(args: tuple[Any, ...], double: bool = False) -> tuple[Any, ...]:
    def leaf(a: Any) -> Any:
        if not isinstance(a, torch.Tensor) or not a.is_floating_point():
            return a
        return (a.detach().double() if double else a.detach().clone()).requires_grad_()
    return tuple(leaf(a) for a in args)


def _grads(fn: Callable[..., torch.Tensor], args: tuple[Any, ...], seed: torch.Tensor | None) -> list[Any]:
    out = fn(*args)
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    grads = torch.autograd.grad(out, leaves, seed.to(out.dtype))
    return [out, *grads]


def run(device: str, backends: list[str], scale: float) -> str:
    rows = []
    timer = (lambda v: interleaved_gpu_times(v, rounds=3, rep_ms=20)) if device == "cuda" else (
        lambda v: {k: s * 1e3 for k, s in median_times(v, reps=10).items()})
    for name, (fn, args) in cases(scale, device).items():
        out_shape = fn(*args).shape
        seed = torch.randn(out_shape, generator=torch.Generator().manual_seed(1)).to(device)
        ref = _grads(fn, _leaves(args, double=True), seed)
        variants: dict[str, Callable[[], Any]] = {"eager": lambda fn=fn, a=args: fn(*a)}
        inductor = torch.compile(fn, dynamic=False)
        variants["inductor"] = lambda f=inductor, a=args: f(*a)
        compiled = {}
        notes = []
        for b in backends:
            report = ember.Report()
            # (on the CPU the generated kernels only with the option: ember's default keeps ATen's)
            options = {"gpu_backend": b} if device == "cuda" else {"cpu_embedding_bag": True}
            compiled[b] = ember.compile(fn, options=options, report=report)
            err = rel_error(_grads(compiled[b], _leaves(args), seed), ref)
            tol = 2e-2 if args[0].dtype == torch.bfloat16 else 1e-5
            notes.append(f"{b}: {'ok' if err <= tol else 'WRONG'} err {err:.1e}, {len(report.kernels)} kernels"
                         + (f", ATen: {', '.join(sorted(set(report.fallbacks)))}" if report.fallbacks else ""))
            variants[b] = lambda f=compiled[b], a=args: f(*a)
        forward = timer(variants)
        train_args = _leaves(args)
        steps = {k: (lambda f=f, a=train_args, s=seed: _grads(f, a, s))
                 for k, f in [("eager", fn), ("inductor", inductor), *compiled.items()]}
        training = timer(steps)
        for label, ms in (("fwd", forward), ("fwd+bwd", training)):
            rows.append((f"{name} {label}", *[f"{ms[k] * 1e3:.1f}" for k in variants],
                         *[f"{ms['inductor'] / ms[b]:.2f}x" for b in backends],
                         *[f"{ms['eager'] / ms[b]:.2f}x" for b in backends],
                         "; ".join(notes) if label == "fwd" else ""))
        torch._dynamo.reset()
    header = ["case", "eager µs", "Inductor µs", *[f"ember-{b} µs" for b in backends],
              *[f"{b} vs Inductor" for b in backends], *[f"{b} vs eager" for b in backends], "checks"]
    return table(rows, header)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="triton,cuda", help="GPU backends to time (cuda: one ember column)")
    p.add_argument("--scale", type=float, default=None, help="sizes times this (default 1 on cuda, 0.125 on cpu)")
    a = p.parse_args()
    backends = [b for b in a.backends.split(",") if b] if a.device == "cuda" else ["cpp"]
    scale = a.scale if a.scale is not None else (1.0 if a.device == "cuda" else 0.125)
    where = f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if a.device == "cuda" else machine()
    print(f"# embedding_bag on {where}, scale {scale}")
    print(run(a.device, backends, scale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
