"""The GPU suite's cases (bench/gpu_fusion.py) compiled by ember's backends: one call each
under Nsight Compute, or (``--time N``) timed alone.

Each case is compiled by each backend asked for and run twice. Then either it is called once
between ``cudaProfilerStart`` and ``cudaProfilerStop``, under ``ncu --profile-from-start off`` so
that only those calls' kernels are profiled:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats -o cases python bench/case_calls.py --cases softmax --backends triton,cuda

or, with ``--time N``, its calls are timed with CUDA events (the median of N samples, each ten
calls back to back between two events, after a sync: the GPU's time where a call's kernels
outlast its host path), with no eager or Inductor run beside them: a quick A/B of ember's
trees (bench/ab_trees.sh), where bench/gpu_fusion.py is the suite's full measure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.gpu_fusion import cases  # noqa: E402


def median_us(fn: Callable[..., Any], inputs: tuple[Any, ...], calls: int) -> float:
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(10):
            fn(*inputs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / 10)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="softmax,cross_entropy", help="of bench/gpu_fusion.py's cases")
    parser.add_argument("--backends", default="triton,cuda", help="ember's GPU backends to profile")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the problem sizes")
    parser.add_argument("--time", type=int, default=0, help="time N calls of each instead (median µs)")
    args = parser.parse_args()
    import ember

    table = cases(args.scale)
    for name in args.cases.split(","):
        fn, make, _ = table[name]
        inputs = make()
        for backend in args.backends.split(","):
            compiled = ember.compile(fn, options={"gpu_backend": backend})
            for _ in range(2):
                compiled(*inputs)
            torch.cuda.synchronize()
            if args.time:
                print(f"{name}, ember-{backend}: {median_us(compiled, inputs, args.time):.1f} µs", flush=True)
            else:
                torch.cuda.profiler.start()
                compiled(*inputs)
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
                print(f"{name}, ember-{backend}: one call profiled", flush=True)
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
