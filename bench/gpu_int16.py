"""GPU check of int16 arithmetic after the ptxas workaround (codegen: int16 negation, +, -, *,
the division family and narrowing casts computed in int32 and cut back through an inline-PTX
``bfe.s32``): exactness against eager on the CPU (inputs that wrap at -32768 included), then
eager vs Inductor vs ember on each GPU backend (CUDA events, medians of interleaved rounds) and
the achieved GB/s, int32 versions of the same programs beside them. One device call:

    python bench/gpu_int16.py [--backends triton,cuda] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import interleaved_gpu_times, table  # noqa: E402

import ember  # noqa: E402


def negate_divide(x, y):
    return (-x) // -3 + y


def multiply_add_halve(x, y):
    return (x * 3 + y) // 2


def absolute_remainder(x, y):
    return x.abs() % 7 - y


def widen_sum(x, y):
    # (a narrowing cast's result widened again: int16 wraps before the int64 sum)
    return (x * y).to(torch.int64).sum(-1)


CASES = {"(-x) // -3 + y": negate_divide, "(x * 3 + y) // 2": multiply_add_halve,
         "|x| % 7 - y": absolute_remainder, "(x * y).sum(-1) int64": widen_sum}


def inputs(dtype: torch.dtype, rows: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (rows, 4096), generator=g, dtype=torch.int64)
    x[:, :8] = info.min  # (where negation and abs wrap)
    y = torch.randint(-40, 40, (rows, 4096), generator=g, dtype=torch.int64)
    return x.to(dtype).to(device), y.to(dtype).to(device)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="triton,cuda")
    p.add_argument("--scale", type=float, default=1.0)
    a = p.parse_args()
    backends = [b for b in a.backends.split(",") if b]
    rows_n = max(int(16384 * a.scale), 1)
    rows = []
    for name, fn in CASES.items():
        for dtype in (torch.int16, torch.int32):
            args = inputs(dtype, rows_n, "cuda")
            want = fn(*(t.cpu() for t in args))
            variants = {"eager": lambda fn=fn, args=args: fn(*args)}
            inductor = torch.compile(fn, dynamic=False)
            variants["inductor"] = lambda f=inductor, args=args: f(*args)
            checks = [f"inductor {'exact' if torch.equal(inductor(*args).cpu(), want) else 'WRONG'}"]
            for b in backends:
                report = ember.Report()
                compiled = ember.compile(fn, options={"gpu_backend": b}, report=report)
                got = compiled(*args).cpu()
                checks.append(f"{b} {'exact' if torch.equal(got, want) else 'WRONG'}, {len(report.kernels)} kernel(s)")
                variants[b] = lambda f=compiled, args=args: f(*args)
            ms = interleaved_gpu_times(variants, rounds=3, rep_ms=20)
            moved = sum(t.numel() * t.element_size() for t in args) + want.numel() * want.element_size()
            times = [f"{ms[k] * 1e3:.1f}" for k in variants]
            rates = [f"{moved / (ms[b] * 1e-3) / 1e9:.0f}" for b in backends]
            rows.append((name, str(dtype).replace("torch.", ""), *times, *rates, "; ".join(checks)))
            torch._dynamo.reset()
    header = ["case", "dtype", "eager µs", "Inductor µs", *[f"ember-{b} µs" for b in backends],
              *[f"{b} GB/s" for b in backends], "checks (against eager on the CPU)"]
    print(f"{torch.cuda.get_device_name()}, {rows_n} x 4096 elements per input")
    print(table(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
