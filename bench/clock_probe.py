"""Why a call's time and its kernels' time differ for the matmul cases: clocks or overhead?

For gpu_fusion's gated MLP (silu(x @ Wg) * (x @ Wu)) and gelu linear layer, ember and Inductor
interleaved: do_bench's median per call (as gpu_fusion times them: a 256 MB L2 flush before each
call), the kernels' device time under the profiler with the same flush between calls, and back
to back without it, and the SM clock and power sampled (NVML) while each variant runs.

    PYTHONPATH=. python bench/clock_probe.py [--cases swiglu,gelu_linear] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import profiled_kernels  # noqa: E402
from gpu_fusion import cases  # noqa: E402

import ember  # noqa: E402


class Sampler:
    """SM clock (MHz) and power (W) every few ms while active, through NVML when it is there."""

    def __init__(self) -> None:
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        except Exception:  # noqa: BLE001
            self.nvml = None
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()

    def __enter__(self) -> Sampler:
        self.samples = []
        self._stop.clear()
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        n = self.nvml
        while not self._stop.wait(0.005):
            self.samples.append((n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                                 n.nvmlDeviceGetPowerUsage(self.handle) / 1000))

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self.nvml is not None:
            self._thread.join()

    def summary(self) -> str:
        if not self.samples:
            return "- | -"
        clocks, watts = zip(*self.samples)
        return f"{statistics.median(clocks):.0f} | {statistics.median(watts):.0f}"


def flushed_kernels(fn: Callable[[], Any], n: int = 10) -> float:
    """Device µs of fn's kernels per call, with do_bench's L2 flush between calls (not counted)."""
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def step() -> None:
        flush.zero_()
        fn()

    kernels = profiled_kernels(step, n)
    return sum(v for k, v in kernels.items() if "elementwise" not in k and "fill" not in k.lower()
               and "memset" not in k.lower())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="swiglu,gelu_linear")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    from triton.testing import do_bench
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("\n| case | variant | round | call µs (do_bench) | kernels µs, flushed | kernels µs, back to back "
          "| SM MHz | W |")
    print("|---|---|---|---|---|---|---|---|")
    sampler = Sampler()
    for name in args.cases.split(","):
        fn, make, _ = cases(1.0)[name]
        inputs = make()
        variants = {"inductor": torch.compile(fn), "ember": ember.compile(fn)}
        for v in variants.values():
            v(*inputs)
        ember.wait_for_kernels()
        for _ in range(3):
            for v in variants.values():
                v(*inputs)
        torch.cuda.synchronize()
        for r in range(args.rounds):
            for label, v in variants.items():
                call = lambda v=v, a=inputs: v(*a)  # noqa: E731
                with sampler:
                    ms = do_bench(call, warmup=5, rep=50, return_mode="median")
                clocks = sampler.summary()
                flushed = flushed_kernels(call)
                back = sum(profiled_kernels(call, 10).values())
                print(f"| {name} | {label} | {r} | {ms * 1e3:.1f} | {flushed:.1f} | {back:.1f} | {clocks} |",
                      flush=True)


if __name__ == "__main__":
    main()
