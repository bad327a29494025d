"""Would a register cap lift a CUDA C++ row kernel's occupancy enough to pay for what it costs?
ember's 4096-wide row kernels run 128 threads of 40 registers (12 blocks, 75% of an SM's
threads), Triton's 31-32 registers at 93%. Registers go to a warp in steps of 8 a thread, so
only a cap of 32 changes the count (all 16 blocks), with spills in every row kernel but
cross-entropy's (`nvcc -Xptxas -v`). Variants, each a rewrite of every row kernel's entry
points before it is built:

- ``lb``: as generated, ``__launch_bounds__(512)``;
- ``nregN``: ``__maxnreg__(N)`` in its place (NVRTC of CUDA 12.4 or later);
- ``lb512xM``: ``__launch_bounds__(512, M)``, which caps the registers at 65536 / (512 M).

The GPU suite's row cases (bench/gpu_fusion.py) through the CUDA C++ backend: error against
float64, then every variant timed in turn (bench/case_calls.py's median of ten calls back to
back), ``--rounds`` times, so each variant meets the GPU's phases alike. One device call:

    EMBER_AOT_CACHE=0 PYTHONPATH=. python bench/row_registers_probe.py [--variants lb,nreg32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ember  # noqa: E402
import ember.codegen.cuda as cuda  # noqa: E402
from bench.case_calls import median_us  # noqa: E402
from bench.common import table  # noqa: E402
from bench.gpu_fusion import cases  # noqa: E402
from bench.row_unroll_probe import error  # noqa: E402

RENDER = cuda.CudaKernelRenderer.render
VARIANT = ["lb"]


def render(self) -> str:
    source = RENDER(self)
    variant = VARIANT[0]
    if self.strategy != "rows" or variant == "lb":
        return source
    if variant.startswith("nreg"):
        bounds = f"__maxnreg__({int(variant[4:])})"
    else:
        threads, blocks = variant[2:].split("x")
        bounds = f"__launch_bounds__({int(threads)}, {int(blocks)})"
    return re.sub(r"__launch_bounds__\(\d+\)", bounds, source)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="lb,nreg34,nreg32,lb512x4")
    parser.add_argument("--cases", default="softmax,cross_entropy,rmsnorm,layernorm")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    cuda.CudaKernelRenderer.render = render
    torch._dynamo.config.recompile_limit = 64  # (every variant a compile of one wrapper's frame)
    suite, variants = cases(1.0), args.variants.split(",")
    rows = []
    for name in args.cases.split(","):
        fn, make, _ = suite[name]
        torch._dynamo.reset()
        inputs = make()
        ref = fn(*[t.double() if t.is_floating_point() else t for t in inputs])
        compiled = {}
        for variant in variants:
            VARIANT[0] = variant
            # (a code object of its own, so Dynamo compiles each variant afresh)
            own = eval("lambda *a: fn(*a)", {"fn": fn})  # noqa: S307
            compiled[variant] = ember.compile(own, options={"gpu_backend": "cuda"})
            compiled[variant](*inputs)
        times = {v: [] for v in variants}
        for _ in range(args.rounds):
            for variant in variants:
                times[variant].append(median_us(compiled[variant], inputs, args.reps))
        for variant in variants:
            err = error(compiled[variant](*inputs), ref)
            us = " / ".join(f"{t:.1f}" for t in times[variant])
            rows.append((name, variant, us, f"{err:.2e}"))
            print(f"{name}, {variant}: {us} µs, error {err:.2e}", flush=True)
    print("\n" + table(rows, ("case", "variant", "µs by round", "error")))


if __name__ == "__main__":
    main()
