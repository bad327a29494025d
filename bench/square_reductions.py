"""A square tensor's reductions along its rows and down its columns (schedule/group_spec.py:
crosswise): eager, Inductor and ember, checked against eager, then medians (CUDA events on a GPU,
interleaved wall times on the CPU).

    PYTHONPATH=. python bench/square_reductions.py [--device cuda] [--size 4096] [--dtype float32]

Their domains are equal by chance; planned as one kernel, one of the two read its rows crosswise.
"""

from __future__ import annotations

import argparse

import torch

import ember
from bench.common import median_times, profiled_kernels, synced_us, table


def softmaxes(x):
    return torch.softmax(x, 0), torch.softmax(x, 1)


def sums_and_norm(x, w):
    return (x * w).sum(0) + x.amax(1), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--profile", action="store_true", help="each variant's kernels (device µs a call; a GPU)")
    a = p.parse_args()
    dtype, n = getattr(torch, a.dtype), a.size
    x = torch.randn(n, n, device=a.device, dtype=dtype)
    w = torch.randn(n, device=a.device, dtype=dtype)
    rows = []
    for name, fn, args in (("softmax(x, 0), softmax(x, 1)", softmaxes, (x,)),
                           ("(x * w).sum(0) + x.amax(1), rms(x)", sums_and_norm, (x, w))):
        torch._dynamo.reset()
        calls = {"eager": fn, "inductor": torch.compile(fn), "ember": ember.compile(fn)}
        for c in calls.values():  # (against float64: a 16-bit sum of 4096 rows is eager's own rounding)
            for got, want in zip(c(*args), fn(*[t.double() for t in args])):
                torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
        if a.device.startswith("cuda"):
            t = {k: synced_us(lambda c=c, args=args: c(*args), a.reps) / 1e3 for k, c in calls.items()}
        else:
            t = {k: v * 1e3 for k, v in median_times({k: (lambda c=c, args=args: c(*args)) for k, c in calls.items()},
                                                    reps=a.reps).items()}
        if a.profile:
            for k, c in calls.items():
                print(k, {kn: round(us, 1) for kn, us in profiled_kernels(lambda c=c, args=args: c(*args)).items()})
        rows.append((f"{name} {a.dtype} {n}x{n}", *(f"{t[k]:.3f}" for k in calls),
                     f"{t['inductor'] / t['ember']:.2f}x"))
    print(table(rows, ("case", "eager ms", "Inductor ms", "ember ms", "vs Inductor")))


if __name__ == "__main__":
    main()
