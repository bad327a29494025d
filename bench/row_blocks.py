"""How wide a block the CUDA C++ backend's row kernels should take, one device call.

A row kernel runs a block per row, sized so that each thread takes one step of UNROLL groups
of 16 bytes (runtime/cuda_launch.py: plan_launch): a 1024-wide bf16 row gets one warp. This
times the row cases below with the launcher's block multiplied by 1, 2, 4 and 8 (up to the
kernel's 512 threads; the blocks still cover a row in one step, fewer groups a thread), next to
eager, Inductor and the Triton backend: CUDA events, medians of interleaved rounds, and the
device time of each variant's kernels. For the launcher's own blocks (x1) it prints each kernel's
registers, launch (grid x block) and the blocks the device holds at once. On an H200 every wider
block was slower (bench/RESULTS.md, fifty-second-run session).

    PYTHONPATH=. python bench/row_blocks.py [--rows 16384] [--widths 1024,4096] [--factors 1,2,4,8]
"""

from __future__ import annotations

import argparse
import gc

import torch
import torch.nn.functional as F

import ember
from bench.common import interleaved_gpu_times, machine, profiled_kernels, rel_error, table
from ember.runtime import cuda_backend, cuda_launch

BF16 = torch.bfloat16
_plan_launch = cuda_launch.plan_launch
_factor = 1  # the block multiplier of the launches planned next


def _widened(strategy, outer, inner, sms, max_threads, vector=1, occupancy=None, row_groups=False, **kw):
    big, grid, block = _plan_launch(strategy, outer, inner, sms, max_threads, vector, occupancy,
                                    row_groups, **kw)
    if strategy == "rows" and isinstance(block, int) and _factor > 1:
        block = min(block * _factor, max(32, max_threads), cuda_backend.cuda.REDUCTION_THREADS)
        resident = (occupancy(block) if occupancy else 0) or sms * min(
            cuda_launch.BLOCKS_PER_SM, cuda_launch.THREADS_PER_SM // block)
        grid = cuda_launch.balanced_grid(outer, resident)
    return big, grid, block


def add_ln_gelu(x, h, w, b):
    """A pre-norm block's residual sum and its norm: the sum stored, gelu(layer_norm(sum))."""
    s = x + h
    return s, F.gelu(F.layer_norm(s, (s.shape[-1],), w, b))


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def rms_norm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def softmax(x):
    return torch.softmax(x, -1)


def cases(rows: int, width: int) -> dict:
    def t(*shape):
        return torch.randn(*shape, device="cuda", dtype=BF16)
    return {
        f"add+LN+gelu {width}": (add_ln_gelu, (t(rows, width), t(rows, width), t(width), t(width))),
        f"LayerNorm {width}": (layer_norm, (t(rows, width), t(width), t(width))),
        f"RMSNorm {width}": (rms_norm, (t(rows, width), t(width))),
        f"softmax {width}": (softmax, (t(rows, width),)),
    }


def _with_factor(fn, factor: int):
    """``fn`` launching its row kernels with blocks ``factor`` times wider: ember shares a kernel
    between compiles of one graph and keeps its launch geometry, so every call plans it again."""
    kernels: list = []
    printed: list = []

    def run(*args):
        global _factor
        _factor = factor
        if not kernels:  # (the first call compiles them)
            fn(*args)
            kernels.extend(o for o in gc.get_objects() if type(o) is cuda_backend.CudaKernel)
        for kernel in kernels:
            for state in kernel._devices.values():
                state["geometry"].clear()
        out = fn(*args)
        if factor == 1 and not printed:
            printed.append(True)
            print("  " + "; ".join(_describe(k) for k in kernels
                                   if k._devices and next(iter(k._devices.values()))["geometry"]))
        return out
    return run


def _describe(kernel) -> str:
    """A kernel's registers a thread, and its launch: grid x block, blocks resident on the device."""
    driver = cuda_backend._driver()
    state = next(iter(kernel._devices.values()))
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
    regs = driver.cuFuncGetAttribute(attr, state["functions"][0])[1]
    launches = ", ".join(f"{g[1]}x{g[3]}" + (f"x{g[4]}" if g[4] > 1 else "") for g in state["geometry"].values())
    resident = ", ".join(f"{v} of {k[1]}" for k, v in state["resident"].items())
    return f"{kernel.name}: {regs} registers, grid x block {launches}, resident {resident}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--widths", default="1024,4096")
    ap.add_argument("--factors", default="1,2,4,8")
    args = ap.parse_args()
    factors = [int(f) for f in args.factors.split(",")]
    cuda_backend.plan_launch = _widened
    torch._dynamo.config.recompile_limit = 64
    print(machine())
    for width in map(int, args.widths.split(",")):
        for name, (fn, inputs) in cases(args.rows, width).items():
            torch._dynamo.reset()  # (each case compiled for its static sizes)
            ref = fn(*(a.double() for a in inputs))
            variants = {"eager": fn, "inductor": torch.compile(fn), "ember-triton": ember.compile(
                fn, options={"gpu_backend": "triton"})}
            compiled = ember.compile(fn, options={"gpu_backend": "cuda"})
            variants.update({f"ember-cuda x{f}": _with_factor(compiled, f) for f in factors})
            errors = {k: rel_error(v(*inputs), ref) for k, v in variants.items()}
            calls = {k: (lambda v=v, a=inputs: v(*a)) for k, v in variants.items()}
            ms = interleaved_gpu_times(calls, rounds=5)
            kernels = {k: sum(profiled_kernels(c).values()) for k, c in calls.items()}
            rows = [[k, f"{errors[k]:.1e}", f"{ms[k] * 1e3:.1f}", f"{kernels[k]:.1f}",
                     f"{ms['inductor'] / ms[k]:.2f}x"] for k in variants]
            print(f"\n{name}: {args.rows} x {width} bf16")
            print(table(rows, ["variant", "rel err", "µs", "kernel µs", "vs Inductor"]))


if __name__ == "__main__":
    main()
