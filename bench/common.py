"""Timing and correctness helpers shared by the benchmark scripts (protocol: ../shared/BENCHMARKS.md).

Correctness first, against a float64 reference on fresh random inputs; then median wall times of
interleaved runs of every variant on the same inputs, after warm-up.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def rel_error(out: Any, ref: Any) -> float:
    """max over outputs of ||out - ref|| / ||ref|| (NaN where ref has none counts as inf)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs):
        o, r = o.double(), r.double()
        if torch.isnan(o).any() and not torch.isnan(r).any():
            return float("inf")
        denom = r.norm().item() or 1.0
        worst = max(worst, (o - r).norm().item() / denom)
    return worst


def median_times(variants: dict[str, Callable[[], Any]], reps: int = 25, warmup: int = 3) -> dict[str, float]:
    """Median seconds per call of each variant, runs interleaved so drift hits all alike."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in samples.items()}


def against_eager_and_inductor(fn: Callable[..., Any], args: Sequence[Any], reps: int,
                               tol: float = 2e-2) -> dict[str, float]:
    """Median seconds a call of eager ``fn``, Inductor's and ember's on ``args`` (interleaved),
    after checking both compiled results against eager's within ``tol``."""
    import ember

    compiled, inductor = ember.compile(fn), torch.compile(fn)
    for variant in (compiled, inductor):
        torch.testing.assert_close(variant(*args), fn(*args), rtol=tol, atol=tol)
    return median_times({"eager": lambda: fn(*args), "inductor": lambda: inductor(*args),
                         "ember": lambda: compiled(*args)}, reps=reps)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def synced_us(step: Callable[[], Any], steps: int = 200) -> float:
    """Median µs of one synchronized call of ``step`` on the GPU (CUDA events around each)."""
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def profiled_kernels(step: Callable[[], Any], n: int = 20, full_names: bool = False) -> dict[str, float]:
    """Device µs of each CUDA kernel (by name, its first 44 characters unless ``full_names``)
    per call of ``step``, the mean over ``n`` calls."""
    from torch.profiler import ProfilerActivity, profile
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    total: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name if full_names else e.name[:44]
            total[name] = total.get(name, 0.0) + e.device_time / n
    return total


def interleaved_gpu_times(variants: dict[str, Callable[[], Any]], rounds: int = 5,
                          rep_ms: int = 25) -> dict[str, float]:
    """Median ms per call of each variant on the GPU: ``rounds`` rounds, each timing every variant
    in turn (CUDA events, triton.testing.do_bench over ``rep_ms``), the median of the rounds.
    Long matmul-bound kernels run at the power limit, where clocks drift with how long the GPU has
    been busy: interleaving spreads that drift over all variants alike."""
    from triton.testing import do_bench
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(do_bench(fn, warmup=5, rep=rep_ms, return_mode="median"))
    return {k: statistics.median(v) for k, v in samples.items()}
