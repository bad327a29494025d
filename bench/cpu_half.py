"""float16 and bfloat16 kernels on this machine's CPU against eager and Inductor: an elementwise chain, layer
norm, softmax and column sums, each checked against eager first, then interleaved medians.

    python bench/cpu_half.py [--reps 20]

The 16-bit conversions set most of the float16 rows' time: GCC does not vectorize a _Float16
conversion, so loops convert float16 a strip at a time with F16C (codegen/cpp_staging.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import against_eager_and_inductor, machine  # noqa: E402


def chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + y * 2 + 1


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def column_sums(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    print(machine())
    torch.manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        rows = torch.randn(4096, 1024, dtype=dtype)
        w, b = torch.randn(1024, dtype=dtype), torch.randn(1024, dtype=dtype)
        big, big2 = torch.randn(4096, 4096, dtype=dtype), torch.randn(4096, 4096, dtype=dtype)
        for name, fn, args in (("relu(x) + 2y + 1, 4096 x 4096", chain, (big, big2)),
                               ("layer_norm, 4096 x 1024", layer_norm, (rows, w, b)),
                               ("softmax, 4096 x 1024", softmax, (rows,)),
                               ("x.sum(0), 4096 x 1024", column_sums, (rows,))):
            t = against_eager_and_inductor(fn, args, a.reps)
            print(f"{str(dtype).split('.')[1]:9s} {name:32s} eager {t['eager'] * 1e3:7.2f} ms  "
                  f"Inductor {t['inductor'] * 1e3:7.2f} ms  ember {t['ember'] * 1e3:7.2f} ms  "
                  f"{t['eager'] / t['ember']:.2f}x eager  {t['inductor'] / t['ember']:.2f}x Inductor")


if __name__ == "__main__":
    main()
