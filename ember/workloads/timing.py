"""Timing, launch counting and error helpers for ``ember bench`` and the scripts in bench/.

Why in the package and not in bench/: ``ember bench giou`` runs from an installed ember, where
the bench/ folder is not importable. The protocol is the one of ../shared/BENCHMARKS.md:
correctness against a float64 reference first, then medians of interleaved runs after warm-up.
On a GPU every call is timed with CUDA events after a ``synchronize``, so a time is the wall time
of one call as the GPU sees it, host launch overhead included (for launch-bound steps such as the
GIoU loss that overhead is most of the cost, and what users pay).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Relative-error tolerance per dtype (../shared/BENCHMARKS.md): float32 well under 1e-4, 16-bit
# floats under 1e-2.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def rel_error(out: Any, ref: Any) -> float:
    """max over outputs of ||out - ref|| / ||ref||; NaN where the reference has none is inf."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        # on the reference's device: a (T, 32000) gradient is too big to copy for a norm
        r = r.detach().double()
        o = o.detach().to(r.device, torch.float64)
        if o.shape != r.shape:
            return math.inf
        if bool(torch.isnan(o).any()) and not bool(torch.isnan(r).any()):
            return math.inf
        denom = r.norm().item() or 1.0
        worst = max(worst, (o - r).norm().item() / denom)
    return worst


def median_times(variants: Mapping[str, Callable[[], Any]], device: torch.device | str, reps: int,
                 warmup: int = 3, reps_of: Mapping[str, int] | None = None,
                 errors: dict[str, str] | None = None) -> dict[str, float]:
    """Median seconds per call of each variant, runs interleaved so drift hits all alike.

    ``reps_of`` lowers the repetitions of slow variants (a per-sample loop); warm-up is then
    one call. A variant that raises is dropped from the timing and its error is written to
    ``errors`` (so one broken variant does not end a whole study).
    """
    device = torch.device(device)
    reps_of = dict(reps_of or {})
    errors = errors if errors is not None else {}
    live = dict(variants)
    for name, fn in list(live.items()):
        try:
            for _ in range(1 if reps_of.get(name, reps) < reps else warmup):
                fn()
            synchronize(device)
        except Exception as e:  # noqa: BLE001 -- reported, the other variants go on
            errors[name] = describe(e)
            del live[name]
    samples: dict[str, list[float]] = {k: [] for k in live}
    for i in range(max((reps_of.get(k, reps) for k in live), default=0)):
        for name, fn in list(live.items()):
            if i >= reps_of.get(name, reps):
                continue
            try:
                samples[name].append(_time_once(fn, device))
            except Exception as e:  # noqa: BLE001
                errors[name] = describe(e)
                del live[name]
                samples.pop(name)
    return {k: statistics.median(v) for k, v in samples.items() if v}


def _time_once(fn: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3
    start_s = time.perf_counter()
    fn()
    return time.perf_counter() - start_s


def wall_time(fn: Callable[[], Any], device: torch.device | str, reps: int, warmup: int = 3) -> float:
    """Median host wall seconds of ``fn()`` followed by a synchronize: for copies, whose cost is
    on the host (staging, one call per tensor) as much as on the device."""
    for _ in range(warmup):
        fn()
        synchronize(device)
    times = []
    for _ in range(reps):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def count_cuda_kernels(fn: Callable[[], Any]) -> int:
    """Kernels one call of ``fn`` launches on the GPU (torch.profiler; copies and memsets not
    counted, as in bench/gpu_fusion.py)."""
    return profile_cuda_kernels(fn)[0]


def cuda_activity(fn: Callable[[], Any]) -> list[tuple[int, int, str]]:
    """(start ns, duration ns, name) of the GPU work (kernels, copies, fills) of one call of
    ``fn``, in start order, after one call to warm up."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    try:
        # The raw Kineto events: ``prof.events()`` builds Python objects and a tree first, which
        # for the per-sample loop's ~90,000 kernels takes tens of seconds.
        out = [(e.start_ns(), e.duration_ns(), e.name()) for e in prof.profiler.kineto_results.events()
               if e.device_type() == cuda]
    except AttributeError:  # a torch whose private profiler API moved
        out = [(int(e.time_range.start * 1e3), int(e.device_time * 1e3), e.name) for e in prof.events()
               if e.device_type == cuda]
    return sorted(out)


def profile_cuda_kernels(fn: Callable[[], Any]) -> tuple[int, float]:
    """(kernels launched, their total GPU time in seconds) for one call of ``fn``. When the
    call's wall time is far above its kernels' time, the host is the bottleneck."""
    kernels = [d for _, d, name in cuda_activity(fn) if not name.startswith(("Memcpy", "Memset"))]
    return len(kernels), sum(kernels) * 1e-9


class _CountAten(TorchDispatchMode):
    """Counts the ATen ops that do work (views and detach launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not getattr(func, "is_view", False) and func.__name__.split(".")[0] not in ("detach", "alias"):
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_aten_calls(fn: Callable[[], Any]) -> int:
    """ATen ops one eager call of ``fn`` runs (forward and, inside ``fn``, backward): on a CPU
    the counterpart of GPU kernel launches. Only for eager code: compiled code would not be
    compiled under a dispatch mode."""
    with _CountAten() as mode:
        fn()
    return mode.count


def describe(e: BaseException, limit: int = 160) -> str:
    """A one-line error for a table cell."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:limit]


def format_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def machine(device: torch.device | str) -> str:
    """The device, threads and versions, for the head of a result table."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        name = f"{name}, {torch.get_num_threads()} threads"
    try:  # a busy machine (another job on the cores) makes CPU times unreliable: say so
        name += f", load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except (OSError, AttributeError):
        pass
    versions = f"torch {torch.__version__}"
    try:
        import triton
        versions += f", triton {triton.__version__}"
    except ImportError:
        pass
    return f"{name}, {versions}"


def busy_warning(device: torch.device | str) -> str | None:
    """A warning when other jobs load this machine's cores: CPU times measured with several
    threads then mostly measure waiting at thread barriers for a descheduled thread."""
    if torch.device(device).type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load <= 0.5 * cores:
        return None
    return (f"warning: the machine was busy before the run (load average {load:.1f} on {cores} cores); "
            f"CPU times are unreliable, run again on an idle machine")


def poison_cuda(limit_bytes: int = 4 << 30) -> None:
    """Fill up to ``limit_bytes`` of free GPU memory with NaN and hand it back to the caching
    allocator, so an output a kernel forgets to write reads NaN instead of an old right answer.
    The allocator's cached blocks go back to the driver first: they are what later outputs would
    reuse, and asking for them as one block on top of the limit once asked for 77 GiB."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    n = max(0, min(free // 2, limit_bytes)) // 4
    if n:
        block = torch.empty(n, dtype=torch.float32, device="cuda")
        block.fill_(float("nan"))
        del block
    torch.cuda.synchronize()


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A Markdown table, columns padded to their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def save_json(results: dict[str, Any], path: str | Path) -> None:
    """Strict JSON (non-finite numbers as the strings 'inf'/'nan'), readable anywhere."""
    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return str(x)
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x
    Path(path).write_text(json.dumps(clean(results), indent=1, allow_nan=False) + "\n")
