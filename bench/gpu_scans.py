"""GPU check of generated scans (cumsum, cumprod, logcumsumexp): correctness against a float64
reference, kernels per call, then eager vs Inductor vs ember on each GPU backend (CUDA events,
medians of interleaved rounds), forward and one training case. One device call:

    python bench/gpu_scans.py [--backends triton,cuda] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, rel_error, table  # noqa: E402

import ember  # noqa: E402


def position_ids(mask):
    # (a padded batch's position ids, as Hugging Face models make them)
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def cumsum_rows(x):
    return x.cumsum(-1)


def cumsum_columns(x):
    return x.cumsum(0)


def softmax_cumsum(x):
    # (top-p sampling's cumulative probabilities of sorted logits)
    return torch.softmax(x.float(), -1).cumsum(-1)


def logcumsumexp_rows(x):
    return torch.logcumsumexp(x, -1)


def cumprod_rows(x):
    return (1 - x.sigmoid() * 0.01).cumprod(-1)


def cases(scale: float, device: str) -> dict[str, tuple]:
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    rows = max(int(16384 * scale), 1)
    lengths = torch.randint(1, 2049, (max(int(256 * scale), 1),), generator=g)
    mask = (torch.arange(2048)[None, :] < lengths[:, None]).to(torch.int64).to(device)
    return {
        "cumsum bf16 rows": (cumsum_rows, (rand(rows, 4096, dtype=torch.bfloat16),)),
        "cumsum f32 rows": (cumsum_rows, (rand(rows, 4096),)),
        "cumsum f32 columns": (cumsum_columns, (rand(4096, max(int(4096 * scale), 1)),)),
        "position ids i64": (position_ids, (mask,)),
        "softmax+cumsum bf16": (softmax_cumsum, (rand(max(int(1024 * scale), 1), 32000, dtype=torch.bfloat16),)),
        "logcumsumexp f32": (logcumsumexp_rows, (rand(max(int(4096 * scale), 1), 4096),)),
        "cumprod f32": (cumprod_rows, (rand(max(int(4096 * scale), 1), 4096),)),
    }


def reference(fn, args):
    return fn(*(a.double() if a.is_floating_point() else a for a in args))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="triton,cuda")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--cases", default="")
    a = p.parse_args()
    device = "cuda"
    backends = [b for b in a.backends.split(",") if b]
    rows = []
    for name, (fn, args) in cases(a.scale, device).items():
        if a.cases and name not in a.cases.split(","):
            continue
        ref = reference(fn, args)
        variants = {"eager": lambda fn=fn, args=args: fn(*args)}
        inductor = torch.compile(fn, dynamic=False)
        variants["inductor"] = lambda f=inductor, args=args: f(*args)
        notes = []
        for b in backends:
            report = ember.Report()
            compiled = ember.compile(fn, options={"gpu_backend": b}, report=report)
            out = compiled(*args)
            err = rel_error(out, ref)
            exact = out.dtype == ref.dtype and torch.equal(out, ref) if not out.is_floating_point() else None
            tol = 2e-2 if out.dtype in (torch.bfloat16, torch.float16) else 1e-5
            ok = exact if exact is not None else err <= tol
            notes.append(f"{b}: {'ok' if ok else 'WRONG'} err {err:.1e}, {len(report.kernels)} kernel(s)"
                         + (f", ATen: {', '.join(report.fallbacks)}" if report.fallbacks else ""))
            variants[b] = lambda f=compiled, args=args: f(*args)
        ms = interleaved_gpu_times(variants, rounds=3, rep_ms=20)
        times = [f"{ms[k] * 1e3:.1f}" for k in variants]
        ratios = [f"{ms['inductor'] / ms[b]:.2f}x" for b in backends]
        rows.append((name, *times, *ratios, "; ".join(notes)))
        torch._dynamo.reset()
    header = ["case", "eager µs", "Inductor µs", *[f"ember-{b} µs" for b in backends],
              *[f"{b} vs Inductor" for b in backends], "checks"]
    print(table(rows, header))
    print(training(backends, device))
    return 0


def training(backends: list[str], device: str) -> str:
    """The gradient of a cumsum (a reversed cumsum) inside a training step, against eager."""
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(4096, 4096, generator=g).to(device)
    w = torch.randn(4096, generator=g).to(device)

    def loss(x, w):
        return (x.cumsum(-1) * w).square().mean()

    leaf = x.clone().requires_grad_()
    loss(leaf.double(), w.double()).backward()
    ref = leaf.grad
    rows = []
    steps = {}
    for b in [None, *backends]:
        f = loss if b is None else ember.compile(loss, options={"gpu_backend": b})
        if b is not None:
            leaf = x.clone().requires_grad_()
            f(leaf, w).backward()
            rows.append((f"grad {b}", f"{rel_error(leaf.grad, ref):.1e}"))
        p = x.clone().requires_grad_()

        def step(f=f, p=p):
            p.grad = None
            f(p, w).backward()
        steps[b or "eager"] = step
    inductor = torch.compile(loss, dynamic=False)
    pi = x.clone().requires_grad_()

    def istep():
        pi.grad = None
        inductor(pi, w).backward()
    steps["inductor"] = istep
    ms = interleaved_gpu_times(steps, rounds=3, rep_ms=20)
    rows += [(f"fwd+bwd {k}", f"{v * 1e3:.1f} µs") for k, v in ms.items()]
    return table(rows, ["training (4096 x 4096 f32)", "value"])


if __name__ == "__main__":
    sys.exit(main())
