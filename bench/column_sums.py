"""Reductions down the columns on this machine's CPU (codegen/cpp_columns.py) against eager and
Inductor: x.sum(0) and x.amax(0) over wide, narrow and tall shapes, a bias gradient (a product's
column sums), a middle-dim mean, and a square's softmaxes down its columns and along its rows.
Each checked against eager first, then interleaved medians.

    python bench/column_sums.py [--reps 30] [--only TEXT]

Narrow column sums are where the threads share the rows (runs) rather than each reading a slice
of every row.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import against_eager_and_inductor, machine, table  # noqa: E402


def cases():
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    for dtype in (f32, bf16, f16):
        for rows, cols in ((4096, 1024), (65536, 64), (512, 8192), (16384, 768)):
            yield f"x.sum(0) {str(dtype)[6:]} {rows}x{cols}", (lambda x: x.sum(0)), ((rows, cols),), dtype
    yield "x.amax(0) float32 65536x64", (lambda x: x.amax(0)), ((65536, 64),), f32
    yield "(dy * x).sum(0) float32 32768x256", (lambda dy, x: (dy * x).sum(0)), ((32768, 256),) * 2, f32
    yield "x.mean(1) float32 8x8192x64", (lambda x: x.mean(1)), ((8, 8192, 64),), f32
    # a square's reductions both ways: one kernel read one of them crosswise (group_spec.crosswise)
    yield ("softmax(x, 0), softmax(x, 1) float32 2048x2048", (lambda x: (torch.softmax(x, 0), torch.softmax(x, 1))),
           ((2048, 2048),), f32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--only", default="", help="run only the cases whose name contains this text")
    a = p.parse_args()
    print(f"# {machine()}")
    torch.manual_seed(0)
    rows = []
    for name, fn, shapes, dtype in cases():
        if a.only not in name:
            continue
        args = [torch.randn(s).to(dtype) for s in shapes]
        torch._dynamo.reset()  # (the cases share their functions' code: past 8 shapes Dynamo gave up)
        t = against_eager_and_inductor(fn, args, a.reps)
        rows.append((name, *(f"{t[k] * 1e3:.3f}" for k in ("eager", "inductor", "ember")),
                     f"{t['eager'] / t['ember']:.2f}x", f"{t['inductor'] / t['ember']:.2f}x"))
    print(table(rows, ("case", "eager ms", "Inductor ms", "ember ms", "vs eager", "vs Inductor")))


if __name__ == "__main__":
    main()
