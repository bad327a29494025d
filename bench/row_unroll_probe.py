"""How many vector groups a CUDA C++ row kernel's thread should take per loop step (UNROLL,
codegen/cuda_prelude.py): fewer make a kept row's blocks larger and its threads' registers fewer
(Triton's softmax over 4096 runs 256 threads of 31 registers at 93% occupancy; ember's 128 of 40
at 71%). The GPU suite's row cases (bench/gpu_fusion.py) at each setting, compiled by the CUDA
C++ backend: their error against eager in float64 and their time (bench/case_calls.py's
median of ten calls back to back). One device call:

    EMBER_AOT_CACHE=0 PYTHONPATH=. python bench/row_unroll_probe.py [--unrolls 4,2] [--cases softmax,...] [--reps 30]

Each setting sets the kernels' macro and the host's constants (launch geometry, which rows are
kept in registers, which take the online softmax) for every kernel, so only row cases are fair.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ember  # noqa: E402
import ember.codegen.cuda as cuda  # noqa: E402
import ember.codegen.cuda_online as cuda_online  # noqa: E402
import ember.codegen.cuda_plan as cuda_plan  # noqa: E402
import ember.codegen.cuda_prelude as cuda_prelude  # noqa: E402
from bench.case_calls import median_us  # noqa: E402
from bench.common import table  # noqa: E402
from bench.gpu_fusion import cases  # noqa: E402

PRELUDE, DEFAULT = cuda_prelude.PRELUDE, cuda_prelude.UNROLL


def set_unroll(unroll: int) -> None:
    for module in (cuda_prelude, cuda, cuda_plan, cuda_online):
        module.UNROLL = unroll
    prelude = PRELUDE.replace(f"#define EMBER_UNROLL {DEFAULT}", f"#define EMBER_UNROLL {unroll}")
    cuda_prelude.PRELUDE = cuda.PRELUDE = prelude


def error(got, ref) -> float:
    got, ref = (got,) if torch.is_tensor(got) else got, (ref,) if torch.is_tensor(ref) else ref
    return max(float((g.double() - r).abs().max()) for g, r in zip(got, ref))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unrolls", default="4,2")
    parser.add_argument("--cases", default="softmax,cross_entropy,rmsnorm,layernorm")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    suite = cases(1.0)
    rows = []
    for name in args.cases.split(","):
        fn, make, _ = suite[name]
        inputs = make()
        ref = fn(*[t.double() if t.is_floating_point() else t for t in inputs])
        for unroll in map(int, args.unrolls.split(",")):
            set_unroll(unroll)
            torch._dynamo.reset()
            compiled = ember.compile(fn, options={"gpu_backend": "cuda"})
            err = error(compiled(*inputs), ref)
            eager_err = error(fn(*inputs), ref)
            us = median_us(compiled, inputs, args.reps)
            rows.append((name, unroll, f"{us:.1f}", f"{err:.2e}", f"{eager_err:.2e}"))
            print(f"{name}, unroll {unroll}: {us:.1f} µs, error {err:.2e} (eager {eager_err:.2e})", flush=True)
    print("\n" + table(rows, ("case", "unroll", "µs", "error", "eager's error")))


if __name__ == "__main__":
    main()
