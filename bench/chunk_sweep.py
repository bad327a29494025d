"""Row kernels that also sum columns (passes/chunks.py): a norm's training step with dw's column
sums in the dx kernel, over run counts and launch configurations, against the step without them.

    PYTHONPATH=. python bench/chunk_sweep.py [--cases rmsnorm,layernorm] [--backends triton,cuda]

For each variant: the gradients' largest error relative to a float64 eager step, the step's
median wall time (CUDA events, do_bench), the backward's wall time alone, and each kernel's
device time (profiler, mean over 20 steps).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import profiled_kernels, table  # noqa: E402

import ember  # noqa: E402

BF16 = torch.bfloat16


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


# (function, parameters, a name part only its backward's row kernel has)
CASES = {"rmsnorm": (rmsnorm, 1, "mul_sum_pow_div_add_"), "layernorm": (layer_norm, 2, "layer_norm_backward_0")}
ONLY = "<case>"

# (name, options): ember's choice, chunks off, run counts, and Triton configurations forced on
# the chunked backward kernel (its name has "backward" or "sum_pow")
VARIANTS = [
    ("off", {"row_chunks": 0}),
    ("auto", {}),
    ("rc132", {"row_chunks": 132}),
    ("rc528", {"row_chunks": 528}),
    ("rc1056", {"row_chunks": 1056}),
    ("rc2112", {"row_chunks": 2112}),
    ("rc264 w16", {"row_chunks": 264, "triton_launch": {"num_warps": 16, "only": ONLY}}),
    ("rc264 x2 w16", {"row_chunks": 264, "triton_launch": {"XBLOCK": 2, "num_warps": 16, "only": ONLY}}),
    ("rc264 w4", {"row_chunks": 264, "triton_launch": {"num_warps": 4, "only": ONLY}}),
]


def run_case(case: str, backends: list[str], n_rows: int, width: int) -> list[list[str]]:
    from triton.testing import do_bench
    fn, n_params, only = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(n_rows, width, device="cuda", dtype=BF16, requires_grad=True)
    params = [torch.randn(width, device="cuda", dtype=BF16, requires_grad=True) for _ in range(n_params)]
    inputs = [x, *params]
    grad = torch.randn(n_rows, width, device="cuda", dtype=BF16)
    ref = torch.autograd.grad(fn(*[t.double() for t in inputs]), inputs, grad.double())
    variants = [("eager", fn), ("inductor", torch.compile(fn))]
    for b in backends:
        for name, options in VARIANTS:
            if "triton_launch" in options:
                if b != "triton":
                    continue
                options = {**options, "triton_launch": {**options["triton_launch"], "only": only}}
            variants.append((f"ember-{b} {name}", ember.compile(fn, options={"gpu_backend": b, **options})))
    rows = []
    for vname, f in variants:
        def step(f=f):
            for t in inputs:
                t.grad = None
            f(*inputs).backward(grad)
        try:
            step()
        except Exception as e:  # noqa: BLE001 -- report and go on
            print(f"  {case} {vname}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        err = max(((t.grad.double() - r).abs().max() / r.abs().max()).item() for t, r in zip(inputs, ref))
        wall = do_bench(step, warmup=25, rep=200, return_mode="median") * 1e3
        out = f(*inputs)

        def backward(out=out):
            torch.autograd.grad(out, inputs, grad, retain_graph=True)
        bwd = do_bench(backward, warmup=25, rep=200, return_mode="median") * 1e3
        kt = profiled_kernels(step)
        rows.append([case, vname, f"{wall:.0f}", f"{bwd:.0f}", f"{sum(kt.values()):.0f}", f"{err:.1e}"])
        print("  " + " | ".join(rows[-1]), flush=True)
        print("    " + "; ".join(f"{k} {v:.1f}" for k, v in kt.items()), flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="rmsnorm,layernorm")
    p.add_argument("--backends", default="triton,cuda")
    p.add_argument("--rows", type=int, default=16384)
    p.add_argument("--width", type=int, default=4096)
    args = p.parse_args()
    torch._dynamo.config.recompile_limit = 64  # many variants of one function
    torch._functorch.config.donated_buffer = False  # the backward alone is timed with retain_graph
    props = torch.cuda.get_device_properties(0)
    print(f"# {props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}")
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        rows += run_case(case, [b for b in args.backends.split(",") if b], args.rows, args.width)
        torch.cuda.empty_cache()
    print(table(rows, ["case", "variant", "step us", "backward us", "kernels us", "grad err vs fp64"]))
    print(f"(EMBER_CACHE_DIR={os.environ.get('EMBER_CACHE_DIR', '~/.cache/ember')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
