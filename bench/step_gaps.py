"""Why a training step's wall time exceeds its kernels' time: the CUDA runtime calls of one step
(allocations, synchronizations, launches) and the GPU's idle time, ember next to Inductor.

    PYTHONPATH=. python bench/step_gaps.py [--case gelu_linear] [--steps 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402
from gpu_fusion import cases, train_step  # noqa: E402

import ember  # noqa: E402

WATCHED = ("cudaMalloc", "cudaFree", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
           "cudaEventSynchronize", "cuLaunchKernel", "cudaLaunchKernel", "cuTensorMapEncode")


def gaps(step, steps: int) -> tuple[float, float, dict[str, tuple[int, float]]]:
    """(wall µs per step, kernel µs per step, {runtime call: (count, µs) per step})."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            step()
        end.record()
        torch.cuda.synchronize()
    wall = start.elapsed_time(end) * 1e3 / steps
    kernels = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / steps
    calls: dict[str, tuple[int, float]] = {}
    for e in prof.key_averages():
        if any(e.key.startswith(w) for w in WATCHED):
            calls[e.key] = (e.count // steps, e.cpu_time_total / steps)
    return wall, kernels, calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="gelu_linear")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    fn, make, _ = cases(1.0)[args.case]
    torch.manual_seed(0)
    inputs = [x.requires_grad_() if x.is_floating_point() else x for x in make()]
    out = fn(*inputs)
    grad = torch.randn_like(out) if out.dim() else None
    rows = []
    for name, f in (("inductor", torch.compile(fn)), ("ember-triton", ember.compile(fn))):
        step = train_step(f, inputs, grad)
        step()
        ember.wait_for_kernels()
        wall, kernels, calls = gaps(step, args.steps)
        detail = "; ".join(f"{k} x{n} {us:.0f}us" for k, (n, us) in sorted(calls.items()))
        rows.append((name, f"{wall:.0f}", f"{kernels:.0f}", f"{wall - kernels:.0f}", detail))
    print(f"{args.case} training step, {args.steps} steps under the profiler (its overhead included)")
    print(table(rows, ["variant", "wall us", "kernels us", "idle us", "runtime calls per step"]))


if __name__ == "__main__":
    main()
