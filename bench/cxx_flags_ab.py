"""A/B of the CPU compiler flags: every case compiled twice in one process, once with ember's
default ``cxx_flags`` and once with them changed, timed in interleaved rounds (the machine's speed
drifts between whole-suite runs; interleaving cancels it).

    python bench/cxx_flags_ab.py --add=-fno-tree-pre   # B: the default and this flag
    python bench/cxx_flags_ab.py --drop=-fno-tree-pre  # A: the default without this flag

Cases: ``bench/cpu_fusion.py``'s, plus relu + max pooling, a bf16 pointwise sum, a bf16 column
sum and a max over relu'd rows. Prints ms medians (6 rounds of 5 calls) and the ratio A / B.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_fusion import cases  # noqa: E402

import ember  # noqa: E402
from ember.config import Config  # noqa: E402


def extra_cases() -> list:
    bf16 = torch.bfloat16
    return [("relu + max_pool2d 2x2, 4x64x112x112", lambda x: F.max_pool2d(torch.relu(x), 2),
             lambda: (torch.randn(4, 64, 112, 112),)),
            ("relu(x) + 2y + 1, 4096² bf16", lambda x, y: torch.relu(x) + 2 * y + 1,
             lambda: (torch.randn(4096, 4096, dtype=bf16), torch.randn(4096, 4096, dtype=bf16))),
            ("x.sum(0), 4096x1024 bf16", lambda x: x.sum(0), lambda: (torch.randn(4096, 1024, dtype=bf16),)),
            ("relu(x).amax(-1), 4096² f32", lambda x: torch.relu(x).amax(-1), lambda: (torch.randn(4096, 4096),))]


def _median_call(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--add", action="append", default=[], help="a flag B has and the default lacks")
    p.add_argument("--drop", action="append", default=[], help="a default flag A lacks")
    p.add_argument("--quick", action="store_true", help="cpu_fusion's small sizes")
    a = p.parse_args()
    torch._dynamo.config.recompile_limit = torch._dynamo.config.cache_size_limit = 1000
    flags_b = tuple(dict.fromkeys(Config().cxx_flags + tuple(a.add)))
    flags_a = tuple(f for f in Config().cxx_flags if f not in a.drop)
    print(f"A: {' '.join(flags_a)}\nB: {' '.join(flags_b)}")
    for name, fn, make in cases(a.quick) + extra_cases():
        args = make()
        fa = ember.compile(lambda *xs, fn=fn: fn(*xs), options={"cxx_flags": flags_a})
        fb = ember.compile(lambda *xs, fn=fn: fn(*xs), options={"cxx_flags": flags_b})
        torch.testing.assert_close(fa(*args), fb(*args))
        rounds_a, rounds_b = [], []
        for _ in range(6):
            rounds_a.append(_median_call(fa, args, 5))
            rounds_b.append(_median_call(fb, args, 5))
        ms_a, ms_b = statistics.median(rounds_a) * 1e3, statistics.median(rounds_b) * 1e3
        print(f"{name:40s} A {ms_a:8.2f}  B {ms_b:8.2f}  A/B {ms_a / ms_b:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
