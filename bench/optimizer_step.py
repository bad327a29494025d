"""An optimizer's step, compiled: eager vs Inductor vs ember on the same parameters.

``torch.optim.Adam(foreach=True)`` (or SGD with momentum, AdamW) over ``--params`` parameters of
``--numel`` floats each. The step writes every parameter and its state in place; a compiled
step must leave them as eager does. Correctness first: three steps of each compiled variant
from the same start as eager's, every parameter and state tensor compared (relative error).
Then the step alone is timed (wall time on the CPU, CUDA events on the GPU, medians of
interleaved runs) with the gradients fixed, and the host program's writes into the inputs
counted: stored in place by a kernel, or copied at the end.

    PYTHONPATH=. python bench/optimizer_step.py [--device cpu|cuda] [--optimizer adam|adamw|sgd]
                                                [--params 8] [--numel 1048576] [--reps 20]
                                                [--profile]  # CUDA kernels a step, with device µs
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable
from typing import Any

import torch

from bench.common import interleaved_gpu_times, machine, median_times, profiled_kernels, rel_error, table

OPTIMIZERS = {"adam": (torch.optim.Adam, {"lr": 1e-3}), "adamw": (torch.optim.AdamW, {"lr": 1e-3}),
              "sgd": (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9})}


def make(args: argparse.Namespace, seed: int = 0) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    g = torch.Generator().manual_seed(seed)
    params = []
    for _ in range(args.params):
        p = torch.randn(args.numel, generator=g).to(args.device).requires_grad_()
        p.grad = torch.randn(args.numel, generator=g).to(args.device)
        params.append(p)
    cls, kwargs = OPTIMIZERS[args.optimizer]
    return params, cls(params, foreach=True, **kwargs)


def state_of(params: list[torch.Tensor], opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [p.detach() for p in params]
    for p in params:
        out += [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return out


def compiled_step(variant: str, opt: torch.optim.Optimizer, report: Any = None) -> Callable[[], Any]:
    if variant == "eager":
        return opt.step
    if variant == "inductor":
        return torch.compile(opt.step)
    import ember
    return ember.compile(opt.step, report=report)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    parser.add_argument("--params", type=int, default=8)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default="eager,inductor,ember")
    parser.add_argument("--profile", action="store_true", help="list each variant's CUDA kernels a step")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*record_function.*")
    import ember

    variants = args.variants.split(",")
    print(f"# {args.optimizer} step, {args.params} x {args.numel} float32 on {args.device}; {machine()}")

    ref_params, ref_opt = make(args)
    for _ in range(3):
        ref_opt.step()
    reference = state_of(ref_params, ref_opt)
    steps: dict[str, Callable[[], Any]] = {}
    rows = []
    for variant in variants:
        params, opt = make(args)
        report = ember.Report() if variant == "ember" else None
        step = compiled_step(variant, opt, report)
        for _ in range(3):
            step()
        error = rel_error(state_of(params, opt), reference)
        writes = ""
        if report is not None:
            wrapper = "\n".join(g.wrapper for g in report.graphs)
            writes = (f"{wrapper.count('stored in place')} in place, "
                      f"{wrapper.count('# the function' + chr(39) + 's write into its input')} copied")
        rows.append([variant, f"{error:.1e}", writes])
        steps[variant] = step
    if args.device == "cuda":
        times = interleaved_gpu_times(steps)
    else:
        times = {k: v * 1e3 for k, v in median_times(steps, reps=args.reps).items()}
    for row in rows:
        row.insert(2, f"{times[row[0]]:.3f}")
    for row in rows:
        base = times.get("eager")
        row.insert(3, f"{base / times[row[0]]:.2f}x" if base else "")
    print(table(rows, ["variant", "rel. error after 3 steps", "ms / step", "vs eager", "input writes"]))
    if args.profile and args.device == "cuda":
        for variant, step in steps.items():
            kernels = profiled_kernels(step)
            print(f"{variant}: {len(kernels)} kernels, {sum(kernels.values()):.1f} device µs a step")
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f}  {name}")


if __name__ == "__main__":
    main()
