"""GPU: eager vs Inductor vs ember (Triton, and CUDA C++ when built) on one device, one run.

    python bench/gpu_fusion.py [--cases relu_add,rmsnorm,...] [--backends triton,cuda] [--train]
                               [--tuning heuristic,full] [--warm-process]

Protocol (../shared/BENCHMARKS.md): correctness of every variant against a float64 reference on
fresh random inputs, with the allocator's free memory poisoned with NaN first so unwritten output
shows; then CUDA-event medians (triton.testing.do_bench, variants interleaved over 5 rounds),
achieved GB/s over the minimum bytes against the copy bandwidth measured in the same run, kernel
launches per call (torch.profiler), and compile latency (cold: empty caches, the first call; for
ember also when the kernels compiling in the background were ready; warm: a fresh compile that
hits the caches, in this process after ``torch._dynamo.reset()`` and, with --warm-process, in a
new process whose one-time costs (imports, CUDA context, Dynamo) were paid on another function
first).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-gpu-cache")

from common import interleaved_gpu_times, profiled_kernels, table  # noqa: E402

import ember  # noqa: E402
from ember.workloads.timing import poison_cuda  # noqa: E402

BF16 = torch.bfloat16


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def relu_add(x, y):
    return torch.relu(x) + y + 1


def gelu_linear(x, w, b):
    return F.gelu(x @ w + b)


def swiglu(x, wg, wu):
    return F.silu(x @ wg) * (x @ wu)


def cases(scale: float):
    r = lambda n: max(1, int(n * scale))  # noqa: E731
    return {
        "relu_add": (relu_add, lambda: (torch.randn(r(64 << 20), device="cuda"),
                                        torch.randn(r(64 << 20), device="cuda")),
                     lambda a: 3 * a[0].numel() * 4),
        "rmsnorm": (rmsnorm, lambda: (torch.randn(r(16384), 4096, device="cuda", dtype=BF16),
                                      torch.randn(4096, device="cuda", dtype=BF16)),
                    lambda a: 2 * a[0].numel() * 2),
        "layernorm": (layer_norm, lambda: (torch.randn(r(16384), 4096, device="cuda", dtype=BF16),
                                           torch.randn(4096, device="cuda", dtype=BF16),
                                           torch.randn(4096, device="cuda", dtype=BF16)),
                      lambda a: 2 * a[0].numel() * 2),
        "softmax": (softmax, lambda: (torch.randn(r(16384), 4096, device="cuda", dtype=BF16),),
                    lambda a: 2 * a[0].numel() * 2),
        "cross_entropy": (cross_entropy, lambda: (torch.randn(r(8192), 32000, device="cuda", dtype=BF16),
                                                  torch.randint(0, 32000, (r(8192),), device="cuda")),
                          lambda a: a[0].numel() * 2 + a[1].numel() * 8),
        "gelu_linear": (gelu_linear, lambda: (torch.randn(r(8192), 4096, device="cuda", dtype=BF16) * 0.05,
                                              torch.randn(4096, 4096, device="cuda", dtype=BF16) * 0.05,
                                              torch.randn(4096, device="cuda", dtype=BF16)),
                        None),
        "swiglu": (swiglu, lambda: (torch.randn(r(8192), 4096, device="cuda", dtype=BF16) * 0.05,
                                    torch.randn(4096, 11008, device="cuda", dtype=BF16) * 0.05,
                                    torch.randn(4096, 11008, device="cuda", dtype=BF16) * 0.05),
                   None),
    }


def rel_error(out, ref) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs):
        o, r = o.double(), r.double()
        if torch.isnan(o).any() and not torch.isnan(r).any():
            return math.inf
        worst = max(worst, ((o - r).norm() / r.norm().clamp_min(1e-30)).item())
    return worst


def poison() -> None:
    """Fill up to 32 GiB of free memory with NaN, so outputs a kernel forgets to write come out
    NaN instead of last run's correct values. (``poison_cuda`` returns the allocator's cache to
    the driver first: asking for the cached bytes as one block on top had asked for 134 GiB, out
    of memory after the matmul cases.)"""
    poison_cuda(32 << 30)


def copy_bandwidth() -> float:
    from triton.testing import do_bench
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3)


def launches(fn, args) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.name.startswith("Memcpy") and not e.name.startswith("Memset"))


def kernel_times(fn, args, cache_dir: str | None = None) -> str:
    """Per-kernel device time of one call, and the launch configuration ember chose for each (its
    Triton tuner in ``cache_dir``, EMBER_CACHE_DIR by default)."""
    from torch.profiler import ProfilerActivity, profile

    from ember.runtime import triton_tuner
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    parts = [f"{e.name[:40]} {e.device_time:.1f}us" for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    root = cache_dir or os.environ.get("EMBER_CACHE_DIR")
    tuner = triton_tuner._tuners.get(Path(root) / "triton" / "tuning.json") if root else None
    chosen = [f"{k.rsplit(':', 2)[-2]}@{k.rsplit(':', 1)[-1]}={v}" for k, v in (tuner.chosen if tuner else {}).items()
              if k.rsplit(":", 2)[-2] in names]
    return "; ".join(parts) + (f"\n    configs: {chosen}" if chosen else "")


TRAIN_CASES = ("rmsnorm", "softmax", "cross_entropy", "layernorm", "gelu_linear", "swiglu")


def train_step(fn, inputs, grad):
    """One forward + backward; float inputs get gradients (targets do not)."""
    def step():
        for x in inputs:
            x.grad = None
        out = fn(*inputs)
        out.backward(grad if out.dim() else None)
    return step


def training(backends: list[str], scale: float, only: list[str], tunings: tuple[str, ...] = ("heuristic",),
             log_tuning: bool = False) -> list[list[str]]:
    rows = []
    for name in [c for c in TRAIN_CASES if not only or c in only]:
        fn, make, _ = cases(scale)[name]
        torch.manual_seed(0)
        inputs = [x.requires_grad_() if x.is_floating_point() else x for x in make()]
        out = fn(*inputs)
        grad = torch.randn_like(out) if out.dim() else None
        variants = {"eager": fn, "inductor": torch.compile(fn)}
        cache_dirs = {}
        for vname, options in ember_variants(backends, list(tunings), log_tuning):
            variants[vname] = ember.compile(fn, options=options)
            cache_dirs[vname] = options.get("cache_dir")
        reference, steps, measured = None, {}, {}
        for vname, f in variants.items():
            step = steps[vname] = train_step(f, inputs, grad)
            step()
            ember.wait_for_kernels()
            grads = [x.grad.double() for x in inputs if x.is_floating_point()]
            reference = reference or grads
            err = max(rel_error(g, r) for g, r in zip(grads, reference))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            measured[vname] = (err, (torch.cuda.max_memory_allocated() - base) / 2**20)
        times = interleaved_gpu_times(steps)
        for vname, step in steps.items():
            err, peak = measured[vname]
            gpu_us = sum(profiled_kernels(step).values())  # host-bound steps: wall time is the host's
            rows.append([name, vname, f"{times[vname] * 1e3:.0f}", f"{gpu_us:.0f}", f"{peak:.0f}", f"{err:.1e}",
                         str(launches(step, []))])
            print("  train " + " | ".join(rows[-1]), flush=True)
            if vname != "eager":
                times_of = kernel_times(lambda *a, step=step: step(), [], cache_dirs.get(vname))
                print(f"    kernels: {times_of}", flush=True)
        del inputs, variants
        torch.cuda.empty_cache()
    return rows


def host_overhead(backends: list[str]) -> None:
    """CPU time per call on a tiny input (the GPU idles): what a small step costs in launches."""
    x, w = torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda")
    variants = {"eager": rmsnorm, "inductor": torch.compile(rmsnorm)}
    for b in backends:
        variants[f"ember-{b}"] = ember.compile(rmsnorm, options={"gpu_backend": b})
    out = []
    for name, f in variants.items():
        for _ in range(20):
            f(x, w)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            f(x, w)
        torch.cuda.synchronize()
        out.append(f"{name} {(time.perf_counter() - start) / 2000 * 1e6:.1f} us")
    print("host time per call, RMSNorm 64x256 fp32: " + ", ".join(out))


ROW_CHUNKS: list[int | None] = [None]  # --row-chunks: None (ember's choice), then variants
EPILOGUES: list[str] = []  # --epilogues: matmul_epilogues modes, each a variant of each backend


def ember_variants(backends: list[str], tunings: list[str], log_tuning: bool = False) -> list[tuple[str, dict]]:
    """(variant name, ember options): Triton once per tuning mode; full tuning gets its own kernel
    cache, so the heuristic runs never find its choices (``log_tuning``: it prints every timing).
    Each further --row-chunks value is a variant of each backend, named ``-rc<n>``."""
    out = []
    for b in backends:
        for chunks in ROW_CHUNKS[1:]:
            out.append((f"ember-{b}-rc{chunks}", {"gpu_backend": b, "row_chunks": chunks}))
        for mode in EPILOGUES:
            out.append((f"ember-{b}-mm{mode}", {"gpu_backend": b, "matmul_epilogues": mode}))
        if b != "triton":
            out.append((f"ember-{b}", {"gpu_backend": b}))
            continue
        for t in tunings:
            options = {"gpu_backend": b, "triton_tuning": t}
            if t != "heuristic":
                options["cache_dir"] = f"{os.environ['EMBER_CACHE_DIR']}-{t}"
                if log_tuning:
                    options["debug"] = 1
            out.append(("ember-triton" if t == "heuristic" else f"ember-triton-{t}", options))
    return out


def warm_child(name: str, scale: float) -> int:
    """In a fresh process: pay the one-time costs (imports, CUDA context, Dynamo's first trace of
    these ops) on the same function at half the size, then time the first call of ``name`` through
    ember (Triton) and Inductor, with their caches warm on disk, and say where ember's time went.
    Prints one JSON line."""
    import torch._dynamo.backends.common as common
    import torch._dynamo.guards as guards

    from ember import api
    from ember.runtime import triton_backend
    spent = {"aot": 0.0, "ember": 0.0, "first_launch": 0.0, "guard_profile": 0.0}

    def timed(key: str, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] += (time.perf_counter() - t0) * 1e3
        return run

    common.aot_module_simplified = timed("aot", common.aot_module_simplified)
    api.compile_graph = timed("ember", api.compile_graph)
    triton_backend.Launcher._prepare = timed("first_launch", triton_backend.Launcher._prepare)
    # Dynamo times each new guard set once, after flushing the CPU caches (any backend pays it)
    if hasattr(guards, "profile_guard_manager"):
        guards.profile_guard_manager = timed("guard_profile", guards.profile_guard_manager)
    fn, make, _ = cases(scale)[name]
    inputs, small = make(), cases(scale / 2)[name][1]()
    out: dict[str, float] = {}
    for label, compiler in (("ember", lambda f: ember.compile(f, options={"gpu_backend": "triton"})),
                            ("inductor", torch.compile)):
        compiler(fn)(*small)
        torch.cuda.synchronize()
        torch._dynamo.reset()
        spent.update(aot=0.0, ember=0.0, first_launch=0.0, guard_profile=0.0)
        t0 = time.perf_counter()
        compiler(fn)(*inputs)
        torch.cuda.synchronize()
        out[label] = (time.perf_counter() - t0) * 1e3
        out.update({f"{label}_{k}": v for k, v in spent.items()})
    print(json.dumps(out))
    return 0


def warm_in_new_processes(selected: list[str], scale: float) -> None:
    rows = []
    for name in selected:
        proc = subprocess.run([sys.executable, __file__, "--warm-child", name, "--scale", str(scale)],
                              capture_output=True, text=True, timeout=300)
        try:
            r = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            print(f"  {name}: warm child failed: {proc.stderr[-800:]}")
            continue
        # ember's compile (its pipeline, module import, launchers) runs inside AOTAutograd's call
        rest = r["ember"] - r["ember_aot"] - r["ember_first_launch"] - r["ember_guard_profile"]
        rows.append([name, f"{r['ember']:.1f}", f"{rest:.1f}", f"{r['ember_guard_profile']:.1f}",
                     f"{r['ember_aot'] - r['ember_ember']:.1f}", f"{r['ember_ember']:.1f}",
                     f"{r['ember_first_launch']:.1f}", f"{r['inductor']:.1f}", f"{r['inductor_aot']:.1f}",
                     f"{r['inductor_guard_profile']:.1f}"])
        print("  warm process " + " | ".join(rows[-1]), flush=True)
    print(table(rows, ["case", "ember ms", "Dynamo trace", "guard timing", "AOTAutograd", "ember compile",
                       "first launch", "Inductor ms", "Ind. AOT+compile", "Ind. guard timing"]))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="")
    p.add_argument("--backends", default="triton")
    p.add_argument("--scale", type=float, default=1.0, help="shrink the problem sizes (smoke runs)")
    p.add_argument("--train", action="store_true",
                   help="forward + backward of the memory-bound cases and the two MLP cases")
    p.add_argument("--no-forward", action="store_true", help="skip the forward-only table")
    p.add_argument("--tuning", default="heuristic",
                   help="Triton launch tuning(s) to compare: heuristic (the default, 'ember-triton') and/or "
                        "full ('ember-triton-full', its own kernel cache)")
    p.add_argument("--warm-process", action="store_true",
                   help="also time each case's warm start in a new process (disk caches), with where it goes")
    p.add_argument("--log-tuning", action="store_true", help="full tuning prints every candidate's time")
    p.add_argument("--row-chunks", default="",
                   help="comma-separated run counts for row kernels that also sum columns (0: off), each an "
                        "extra ember variant (ember-<backend>-rc<n>) beside ember's own choice")
    p.add_argument("--epilogues", default="",
                   help="comma-separated matmul_epilogues modes (auto, all, off), each an extra ember variant "
                        "(ember-<backend>-mm<mode>) beside the default")
    p.add_argument("--warm-child", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    ROW_CHUNKS.extend(int(c) for c in args.row_chunks.split(",") if c)
    EPILOGUES.extend(m for m in args.epilogues.split(",") if m)
    if args.warm_child:
        return warm_child(args.warm_child, args.scale)
    tunings = [t for t in args.tuning.split(",") if t]
    import triton

    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}")
    bw = copy_bandwidth()
    print(f"# copy bandwidth {bw / 1e9:.0f} GB/s (read + write)")
    selected = [] if args.no_forward else ([c for c in args.cases.split(",") if c] or list(cases(args.scale)))
    backends = [b for b in args.backends.split(",") if b]
    rows, failed = [], False
    for name in selected:
        fn, make, nbytes = cases(args.scale)[name]
        torch.manual_seed(0)
        inputs = make()
        ref = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
        variants, cache_dirs = {"eager": fn}, {}
        t0 = time.perf_counter()
        inductor = torch.compile(fn)
        inductor(*inputs)
        torch.cuda.synchronize()
        compile_ms = {"inductor": (time.perf_counter() - t0) * 1e3}
        variants["inductor"] = inductor
        # Inductor's warm start, as ember's below: a fresh compile after a Dynamo reset
        torch._dynamo.reset()
        t0 = time.perf_counter()
        torch.compile(fn)(*inputs)
        torch.cuda.synchronize()
        compile_ms["inductor warm"] = (time.perf_counter() - t0) * 1e3
        for vname, options in ember_variants(backends, tunings, args.log_tuning):
            report = ember.Report()
            t0 = time.perf_counter()
            fast = ember.compile(fn, options=options, report=report)
            try:
                fast(*inputs)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- report and go on with the other variants
                print(f"  {name} {vname}: FAILED {type(e).__name__}: {str(e)[:300]}")
                failed = True
                continue
            compile_ms[vname] = (time.perf_counter() - t0) * 1e3
            # matmul kernels compile in the background (calls meanwhile run through ATen): the
            # first call's time above, and when every kernel is ready
            ember.wait_for_kernels()
            compile_ms[f"{vname} ready"] = (time.perf_counter() - t0) * 1e3
            errors = [g.error for g in report.graphs if g.error] + [k.name for k in report.kernels if not k.built]
            if errors:
                print(f"  {name} {vname}: fell back: {errors}")
            variants[vname] = fast
            cache_dirs[vname] = options.get("cache_dir")
            # warm start: a fresh compile of the same program hits ember's and Triton's caches.
            # The compile above kept a report, which runs the whole pipeline and fills no AOT
            # cache entry: one compile without a report fills it, as a user's first run would
            torch._dynamo.reset()
            ember.compile(fn, options=options)(*inputs)
            ember.wait_for_kernels()  # a kernel still loading in the background would time in
            torch._dynamo.reset()
            again = ember.compile(fn, options=options)
            t0 = time.perf_counter()
            again(*inputs)
            torch.cuda.synchronize()
            compile_ms[f"{vname} warm"] = (time.perf_counter() - t0) * 1e3
            ember.wait_for_kernels()
            print(f"  {name} {vname}: cold compile {compile_ms[vname]:.0f} ms (kernels ready after "
                  f"{compile_ms[vname + ' ready']:.0f} ms), warm start "
                  f"{compile_ms[vname + ' warm']:.0f} ms; Inductor cold {compile_ms['inductor']:.0f} ms, "
                  f"warm {compile_ms['inductor warm']:.0f} ms", flush=True)
        errors = {}
        for vname, f in variants.items():
            poison()
            errors[vname] = err = rel_error(f(*inputs), ref)
            tol = 1e-4 if inputs[0].dtype == torch.float32 else 1e-2
            if err > tol and vname.startswith("ember"):
                failed = True
        times = interleaved_gpu_times({v: (lambda f=f, xs=inputs: f(*xs)) for v, f in variants.items()})
        for vname, f in variants.items():
            ms, err = times[vname], errors[vname]
            gbs = nbytes(inputs) / (ms * 1e-3) / 1e9 if nbytes else float("nan")
            rows.append([name, vname, f"{ms * 1e3:.1f}", f"{gbs:.0f}" if nbytes else "-",
                         f"{100 * gbs * 1e9 / bw:.0f}%" if nbytes else "-", f"{err:.1e}",
                         str(launches(f, inputs)), f"{compile_ms.get(vname, float('nan')):.0f}",
                         f"{compile_ms.get(vname + ' ready', float('nan')):.0f}",
                         f"{compile_ms.get(vname + ' warm', float('nan')):.0f}"])
            print("  " + " | ".join(rows[-1]), flush=True)
            if vname.startswith("ember"):
                print(f"    kernels: {kernel_times(f, inputs, cache_dirs.get(vname))}", flush=True)
        del inputs, ref, variants
        torch.cuda.empty_cache()
    if rows:
        print(table(rows, ["case", "variant", "us", "GB/s", "of copy", "rel err", "launches", "compile ms", "ready ms",
                           "warm ms"]))
    if args.warm_process:
        warm_in_new_processes(selected, args.scale)
    if args.train:
        train_rows = training(backends, args.scale, [c for c in args.cases.split(",") if c], tuple(tunings),
                              args.log_tuning)
        print(table(train_rows, ["case (fwd+bwd)", "variant", "us", "kernels us", "peak MiB", "grad rel err vs eager",
                                 "launches"]))
    host_overhead(backends)
    print(f"ember.stats() = {ember.stats()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
