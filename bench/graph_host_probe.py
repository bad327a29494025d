"""Host time of one ``ember.cuda_graph`` call in the ragged suite's softmax case, by function
(cProfile), to see where a synchronized graphed call's time goes.

    PYTHONPATH=. python bench/graph_host_probe.py [--case softmax] [--calls 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ragged_suite as suite  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="softmax")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    case = suite.make_case(args.case, suite.GPU_SIZES, torch.device("cuda"), torch.bfloat16)
    grad = case.grad_ragged
    fwd, train = suite._ember_graph_steps(case, grad)
    for name, step in (("forward", fwd), ("train", train)):
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.calls):
            step()
        host = (time.perf_counter() - start) * 1e6 / args.calls
        torch.cuda.synchronize()
        synced = []
        for _ in range(50):
            t = time.perf_counter()
            step()
            torch.cuda.synchronize()
            synced.append((time.perf_counter() - t) * 1e6)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            step()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
        print(f"{args.case} {name}: host us per call {host:.1f}, synced median {sorted(synced)[25]:.1f}")
        print(out.getvalue())


if __name__ == "__main__":
    main()
