"""GPU: eager vs Inductor vs ember (Triton, and CUDA C++ when built) on one device, one run.

    python bench/gpu_fusion.py [--cases relu_add,rmsnorm,...] [--backends triton,cuda] [--train]

Protocol (../shared/BENCHMARKS.md): correctness of every variant against a float64 reference on
fresh random inputs, with the allocator's free memory poisoned with NaN first so unwritten output
shows; then CUDA-event medians (triton.testing.do_bench), achieved GB/s over the minimum bytes
against the copy bandwidth measured in the same run, kernel launches per call (torch.profiler),
and compile latency (cold: empty caches; warm: a fresh compile that hits the caches).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("EMBER_CACHE_DIR", "/tmp/ember-gpu-cache")

from common import table  # noqa: E402

import ember  # noqa: E402

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
    """Fill the caching allocator's free memory with NaN, so outputs a kernel forgets to write
    come out NaN instead of last run's correct values."""
    free, _ = torch.cuda.mem_get_info()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    n = max(0, min(free - (4 << 30), 32 << 30) + cached) // 4
    if n:
        block = torch.empty(n, dtype=torch.float32, device="cuda")
        block.fill_(float("nan"))
        del block
    torch.cuda.synchronize()


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


def kernel_times(fn, args) -> str:
    """Per-kernel device time of one call, and the launch configuration ember's tuner chose."""
    from torch.profiler import ProfilerActivity, profile

    from ember.runtime import triton_backend
    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    parts = [f"{e.name[:40]} {e.device_time:.1f}us" for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    chosen = [f"{k.rsplit(':', 2)[-2]}@{k.rsplit(':', 1)[-1]}={v}" for t in triton_backend._tuners.values()
              for k, v in t.best.items()]
    return "; ".join(parts) + (f"\n    tuned: {chosen[-3:]}" if chosen else "")


TRAIN_CASES = ("rmsnorm", "softmax", "cross_entropy", "layernorm")


def train_step(fn, inputs, grad):
    """One forward + backward; float inputs get gradients (targets do not)."""
    def step():
        for x in inputs:
            x.grad = None
        out = fn(*inputs)
        out.backward(grad if out.dim() else None)
    return step


def training(backends: list[str], scale: float, only: list[str]) -> list[list[str]]:
    from triton.testing import do_bench
    rows = []
    for name in [c for c in TRAIN_CASES if not only or c in only]:
        fn, make, _ = cases(scale)[name]
        torch.manual_seed(0)
        inputs = [x.requires_grad_() if x.is_floating_point() else x for x in make()]
        out = fn(*inputs)
        grad = torch.randn_like(out) if out.dim() else None
        variants = {"eager": fn, "inductor": torch.compile(fn)}
        for b in backends:
            variants[f"ember-{b}"] = ember.compile(fn, options={"gpu_backend": b})
        reference = None
        for vname, f in variants.items():
            step = train_step(f, inputs, grad)
            step()
            grads = [x.grad.double() for x in inputs if x.is_floating_point()]
            reference = reference or grads
            err = max(rel_error(g, r) for g, r in zip(grads, reference))
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            ms = do_bench(step, warmup=25, rep=100, return_mode="median")
            rows.append([name, vname, f"{ms * 1e3:.0f}", f"{peak:.0f}", f"{err:.1e}", str(launches(step, []))])
            print("  train " + " | ".join(rows[-1]), flush=True)
            if vname.startswith("ember"):
                print(f"    kernels: {kernel_times(lambda *a, step=step: step(), [])}", flush=True)
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="")
    p.add_argument("--backends", default="triton")
    p.add_argument("--scale", type=float, default=1.0, help="shrink the problem sizes (smoke runs)")
    p.add_argument("--train", action="store_true", help="forward + backward of the memory-bound cases")
    p.add_argument("--no-forward", action="store_true", help="skip the forward-only table")
    args = p.parse_args()
    import triton
    from triton.testing import do_bench

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
        variants = {"eager": fn}
        t0 = time.perf_counter()
        inductor = torch.compile(fn)
        inductor(*inputs)
        torch.cuda.synchronize()
        compile_ms = {"inductor": (time.perf_counter() - t0) * 1e3}
        variants["inductor"] = inductor
        for backend in backends:
            report = ember.Report()
            t0 = time.perf_counter()
            fast = ember.compile(fn, options={"gpu_backend": backend}, report=report)
            try:
                fast(*inputs)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 -- report and go on with the other variants
                print(f"  {name} ember-{backend}: FAILED {type(e).__name__}: {str(e)[:300]}")
                failed = True
                continue
            compile_ms[backend] = (time.perf_counter() - t0) * 1e3
            errors = [g.error for g in report.graphs if g.error] + [k.name for k in report.kernels if not k.built]
            if errors:
                print(f"  {name} ember-{backend}: fell back: {errors}")
            variants[f"ember-{backend}"] = fast
            # warm start: a fresh compile of the same program hits ember's and Triton's caches
            torch._dynamo.reset()
            again = ember.compile(fn, options={"gpu_backend": backend})
            t0 = time.perf_counter()
            again(*inputs)
            torch.cuda.synchronize()
            compile_ms[f"{backend} warm"] = (time.perf_counter() - t0) * 1e3
            print(f"  {name} ember-{backend}: cold compile {compile_ms[backend]:.0f} ms, warm start "
                  f"{compile_ms[backend + ' warm']:.0f} ms, Inductor cold {compile_ms['inductor']:.0f} ms", flush=True)
        for vname, f in variants.items():
            poison()
            err = rel_error(f(*inputs), ref)
            tol = 1e-4 if inputs[0].dtype == torch.float32 else 1e-2
            if err > tol and vname.startswith("ember"):
                failed = True
            ms = do_bench(lambda f=f, xs=inputs: f(*xs), warmup=25, rep=100, return_mode="median")
            gbs = nbytes(inputs) / (ms * 1e-3) / 1e9 if nbytes else float("nan")
            rows.append([name, vname, f"{ms * 1e3:.1f}", f"{gbs:.0f}" if nbytes else "-",
                         f"{100 * gbs * 1e9 / bw:.0f}%" if nbytes else "-", f"{err:.1e}",
                         str(launches(f, inputs)),
                         f"{compile_ms.get(vname.removeprefix('ember-'), float('nan')):.0f}"])
            print("  " + " | ".join(rows[-1]), flush=True)
            if vname.startswith("ember"):
                print(f"    kernels: {kernel_times(f, inputs)}", flush=True)
        del inputs, ref, variants
        torch.cuda.empty_cache()
    if rows:
        print(table(rows, ["case", "variant", "us", "GB/s", "of copy", "rel err", "launches", "compile ms"]))
    if args.train:
        train_rows = training(backends, args.scale, [c for c in args.cases.split(",") if c])
        print(table(train_rows, ["case (fwd+bwd)", "variant", "us", "peak MiB", "grad rel err vs eager", "launches"]))
    host_overhead(backends)
    print(f"ember.stats() = {ember.stats()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
