"""Warm-start latency: a fresh compile of a program whose artifacts are already cached on disk.

    python bench/warm_start.py [--device cpu|cuda] [--cases rmsnorm,cross_entropy,gelu_linear,swiglu] [--reps 7]
                               [--backends ember,inductor] [--no-aot-cache] [--profile N]

Two warm starts per case and backend. In-process: the program was compiled and run once, then
``torch._dynamo.reset()`` and the same call again (median of ``--reps``). New process: a fresh
interpreter pays its one-time costs (imports, Dynamo's first trace of these ops) on the same
function at half the size, resets Dynamo, then times the first call at full size (median over
``--reps`` processes). After each first call, the calls a timed choice takes to choose between its
two programs (runtime/choice.py; a GPU saves the choice, which the later warm starts then serve
without building the other program), then one more, timed. Each warm start is broken down into each
stage's own time: Dynamo (tracing and the rest: what is left), guard building, AOTAutograd
(tracing, partitioning), the AOT cache look-up (key, load), ember (a compile, or the rebuild of a
cached graph) and the run (a steady call's time: what the first call spent running kernels). The
training case runs forward and backward (without the AOT cache, the backward graph is compiled at
its first call). Caches live in a fresh temporary directory per run of this script. ``--profile N``
also prints the N functions with the most own time (cProfile) of one more in-process warm start per
case.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__" and "--child" not in sys.argv:
    # fresh caches for this run, shared by the child processes (set before torch is imported)
    _tmp = tempfile.mkdtemp(prefix="ember-warm-")
    os.environ["EMBER_CACHE_DIR"] = f"{_tmp}/ember"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{_tmp}/torch"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, table  # noqa: E402

import ember  # noqa: E402
from ember.runtime import choice  # noqa: E402

PARTS = ("guards", "aot", "aot_cache", "ember", "run")


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def gelu_linear(x, w, b):
    return F.gelu(x @ w + b)


def swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def make(case: str, device: str, scale: float) -> tuple:
    rows = max(2, int(256 * scale))
    if case == "rmsnorm":
        return torch.randn(rows, 1024, device=device), torch.randn(1024, device=device)
    if case in ("gelu_linear", "swiglu"):  # 16-bit: on a Hopper GPU, ember's matmul kernel
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        x = torch.randn(rows * 8, 1024, device=device, dtype=dtype)
        w = torch.randn(1024, 2816, device=device, dtype=dtype) * 0.03
        last = torch.randn(2816, device=device, dtype=dtype) if case == "gelu_linear" else w.clone()
        return x, w, last
    logits = torch.randn(rows, 4096, device=device, requires_grad=True)
    return logits, torch.randint(0, 4096, (rows,), device=device)


CASES = {"rmsnorm": rmsnorm, "cross_entropy": cross_entropy, "gelu_linear": gelu_linear, "swiglu": swiglu}


def compiler(backend: str, aot_cache: bool):
    if backend == "ember":
        return lambda fn: ember.compile(fn, options={"aot_cache": aot_cache})
    return torch.compile


class Breakdown:
    """Milliseconds spent in each stage of a compile, by wrapping the functions that run them;
    each stage's own time, without the stages it calls (ember compiles inside AOTAutograd's call,
    and rebuilds inside the AOT cache look-up)."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)
        self._stack: list[list[float]] = []  # [time in stages called from this one]
        import torch._dynamo.backends.common as common
        import torch._dynamo.guards as guards

        from ember import api, driver
        self._wrap(common, "aot_module_simplified", "aot")
        self._wrap(api, "compile_graph", "ember")
        self._wrap(driver, "rebuild_graph", "ember")
        self._wrap(guards.CheckFunctionManager, "__init__", "guards")
        try:
            from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
            original = AOTAutogradCache.__dict__["try_load"].__func__
            AOTAutogradCache.try_load = staticmethod(self._timed("aot_cache", original))
        except (ImportError, KeyError, AttributeError):
            pass

    def _timed(self, key: str, fn):
        def run(*args, **kwargs):
            self._stack.append([0.0])
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = (time.perf_counter() - start) * 1e3
                (inner,) = self._stack.pop()
                self.spent[key] += elapsed - inner
                if self._stack:
                    self._stack[-1][0] += elapsed
        return run

    def _wrap(self, owner, name: str, key: str) -> None:
        if hasattr(owner, name):
            setattr(owner, name, self._timed(key, getattr(owner, name)))

    def reset(self) -> None:
        self.spent = dict.fromkeys(PARTS, 0.0)

    def parts(self, total: float) -> dict[str, float]:
        out = {"total": total, **self.spent}
        out["dynamo"] = total - sum(self.spent.values())
        return out


def call(case: str, fn, args: tuple) -> None:
    out = fn(*args)
    if case == "cross_entropy":
        out.backward()  # compiles the backward graph at its first call, unless it came from a cache
    if args[0].is_cuda:
        torch.cuda.synchronize()


def first_call(case: str, backend: str, aot_cache: bool, args: tuple, breakdown: Breakdown) -> dict[str, float]:
    torch._dynamo.reset()
    breakdown.reset()
    start = time.perf_counter()
    compiled = compiler(backend, aot_cache)(CASES[case])
    call(case, compiled, args)
    total = (time.perf_counter() - start) * 1e3
    ember.wait_for_kernels()  # (a cold start's matmul kernels compile in the background: cached for the next)
    for _ in range(2 * (choice.WARMUP + choice.SAMPLES)):
        call(case, compiled, args)  # a timed choice's calls (runtime/choice.py): chosen, and saved on a GPU
    start = time.perf_counter()
    call(case, compiled, args)  # a steady call: what the first one spent running
    breakdown.spent["run"] = (time.perf_counter() - start) * 1e3
    return breakdown.parts(total)


def child(case: str, backend: str, aot_cache: bool, device: str) -> None:
    breakdown = Breakdown()
    first_call(case, backend, aot_cache, make(case, device, 0.5), breakdown)  # one-time costs
    counters = torch._dynamo.utils.counters["aot_autograd"]
    counters.clear()
    parts = first_call(case, backend, aot_cache, make(case, device, 1.0), breakdown)
    parts["aot_cache_hits"] = counters["autograd_cache_hit"]
    print(json.dumps(parts))


def print_profile(label: str, top: int, run) -> None:
    """cProfile of one warm start: the ``top`` functions by own time, then by cumulative time."""
    import cProfile
    import io
    import pstats
    profile = cProfile.Profile()
    profile.runcall(run)
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(order).print_stats(top)
        text = out.getvalue()
        print(f"--- {label}: warm start profiled, by {order}\n" + text[text.find("ncalls"):], flush=True)


def median_parts(samples: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def row(label: str, p: dict[str, float]) -> list[str]:
    return [label, f"{p['total']:.1f}", f"{p['total'] - p['run']:.1f}", f"{p['dynamo']:.1f}", f"{p['guards']:.1f}",
            f"{p['aot']:.1f}", f"{p['aot_cache']:.1f}", f"{p['ember']:.1f}", f"{p['run']:.1f}",
            f"{p.get('aot_cache_hits', 0):.0f}"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--cases", default="rmsnorm,cross_entropy")
    p.add_argument("--backends", default="ember,inductor")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--no-aot-cache", action="store_true", help="ember without torch's AOTAutograd cache")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N functions with the most own time in one more in-process warm start")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    aot_cache = not args.no_aot_cache
    if args.child:
        child(args.child[0], args.child[1], aot_cache, args.device)
        return 0
    print(f"{machine()}; ember aot_cache={aot_cache}")
    rows = []
    for case in args.cases.split(","):
        for backend in args.backends.split(","):
            breakdown = Breakdown()
            inputs = make(case, args.device, 1.0)
            first_call(case, backend, aot_cache, inputs, breakdown)  # cold: fills the caches
            counters = torch._dynamo.utils.counters["aot_autograd"]
            samples = []
            for _ in range(args.reps):
                counters.clear()
                samples.append(first_call(case, backend, aot_cache, inputs, breakdown))
                samples[-1]["aot_cache_hits"] = counters["autograd_cache_hit"]
            rows.append(row(f"{case} {backend} in-process", median_parts(samples)))
            if args.profile:
                print_profile(f"{case} {backend}", args.profile, functools.partial(
                    first_call, case, backend, aot_cache, inputs, breakdown))
            samples = []
            for _ in range(args.reps):
                cmd = [sys.executable, __file__, "--child", case, backend, "--device", args.device]
                proc = subprocess.run(cmd + (["--no-aot-cache"] if not aot_cache else []),
                                      capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    print(f"{case} {backend}: child failed:\n{proc.stderr[-2000:]}")
                    break
                samples.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if samples:
                rows.append(row(f"{case} {backend} new process", median_parts(samples)))
            print("\n".join(" | ".join(r) for r in rows[-2:]), flush=True)
    print(table(rows, ["warm start", "total ms", "less run", "Dynamo", "guards", "AOTAutograd", "AOT cache",
                       "ember", "run", "AOT hits"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
