"""An optimizer's step, compiled: eager vs Inductor vs ember on the same parameters.

``torch.optim.Adam(foreach=True)`` (or SGD with momentum, AdamW) over ``--params`` parameters of
``--numel`` floats each. The step writes every parameter and its state in place; a compiled
step must leave them as eager does. Correctness first: three steps of each compiled variant
from the same start as eager's, every parameter and state tensor compared (relative error).
Then the step alone is timed (wall time on the CPU, CUDA events on the GPU, medians of
interleaved runs; on the GPU also the host's time to issue a step) with the gradients fixed,
and the host program's writes into the inputs counted: stored in place by a kernel, or copied at
the end.

    PYTHONPATH=. python bench/optimizer_step.py [--device cpu|cuda] [--optimizer adam|adamw|sgd]
                                                [--params 8] [--numel 1048576] [--reps 20]
                                                [--gpt 768,12,50257]  # a GPT-2-style model's parameters
                                                [--profile]  # CUDA kernels a step, with device µs
                                                [--ncu]  # one step each, for Nsight Compute (below)

``--ncu`` checks each variant, then runs one step of each between ``cudaProfilerStart`` and
``cudaProfilerStop`` and times nothing: under ``ncu --profile-from-start off`` only those steps'
kernels are profiled (bench/gpu_optimizer_session.sh's ncu parts).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import time
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
    for shape in shapes_of(args):
        p = torch.randn(shape, generator=g).to(args.device).requires_grad_()
        p.grad = torch.randn(shape, generator=g).to(args.device)
        params.append(p)
    cls, kwargs = OPTIMIZERS[args.optimizer]
    return params, cls(params, foreach=True, **kwargs)


def shapes_of(args: argparse.Namespace) -> list[tuple[int, ...]]:
    """``--params`` tensors of ``--numel`` floats, or with ``--gpt WIDTH,LAYERS,VOCAB`` the
    parameters of a GPT-2-style model (embeddings, per layer two LayerNorms, the attention's qkv
    and output projections and the MLP's two, with biases; a final LayerNorm): 12 sizes."""
    if not args.gpt:
        return [(args.numel,)] * args.params
    d, layers, vocab = (int(x) for x in args.gpt.split(","))
    layer = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [(vocab, d), (1024, d)] + layer * layers + [(d,), (d,)]


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
    if variant == "ember-nocombo":  # a launch per kernel (codegen/triton_combos.py off)
        return ember.compile(opt.step, report=report, options={"combo_kernels": False})
    if variant.startswith("ember-cuda"):  # the CUDA C++ backend; -uN: its combo parts unrolled N times
        from ember.codegen import cuda_combos
        unroll = variant.removeprefix("ember-cuda").removeprefix("-u")
        cuda_combos.COMBO_UNROLL = int(unroll or cuda_combos.COMBO_UNROLL)  # read as the step compiles, below
        return ember.compile(opt.step, report=report, options={"gpu_backend": "cuda"})
    return ember.compile(opt.step, report=report)


def host_times(steps: dict[str, Callable[[], Any]], calls: int = 30, rounds: int = 5) -> dict[str, float]:
    """Host µs a step: calls issued back to back, without a sync (the GPU's queue takes them),
    timed on the host clock; medians of interleaved rounds."""
    seen: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                step()
            seen[name].append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return {k: sorted(v)[len(v) // 2] for k, v in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    parser.add_argument("--params", type=int, default=8)
    parser.add_argument("--numel", type=int, default=1 << 20)
    parser.add_argument("--gpt", default="", help="WIDTH,LAYERS,VOCAB: a GPT-2-style model's parameters instead")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--variants", default="eager,inductor,ember",
                        help="of eager, inductor, ember, ember-nocombo, ember-cuda, ember-cuda-uN "
                        "(combo parts unrolled N times)")
    parser.add_argument("--profile", action="store_true", help="list each variant's CUDA kernels a step")
    parser.add_argument("--ncu", action="store_true", help="profile one step of each variant (under ncu), time nothing")
    parser.add_argument("--host-profile", type=int, default=0,
                        help="print the N functions with the most host time in 50 steps of each compiled variant")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*record_function.*")
    import ember

    variants = args.variants.split(",")
    shapes = shapes_of(args)
    what = f"GPT {args.gpt}: {len(shapes)} parameters, {sum(map(math.prod, shapes))} floats" if args.gpt else (
        f"{args.params} x {args.numel} float32")
    print(f"# {args.optimizer} step, {what} on {args.device}; {machine()}")

    ref_params, ref_opt = make(args)
    for _ in range(3):
        ref_opt.step()
    reference = state_of(ref_params, ref_opt)
    steps: dict[str, Callable[[], Any]] = {}
    rows = []
    for variant in variants:
        params, opt = make(args)
        report = ember.Report() if variant.startswith("ember") else None
        start = time.perf_counter()
        step = compiled_step(variant, opt, report)
        for _ in range(3):
            step()
        print(f"{variant}: compiled and 3 steps in {time.perf_counter() - start:.1f} s", flush=True)
        error = rel_error(state_of(params, opt), reference)
        writes = ""
        if report is not None:
            wrapper = "\n".join(g.wrapper for g in report.graphs)
            writes = (f"{sum(len(g.kernels) for g in report.graphs)} kernels; "
                      f"{wrapper.count('stored in place')} in place, "
                      f"{wrapper.count('# the function' + chr(39) + 's write into its input')} copied")
        rows.append([variant, f"{error:.1e}", writes])
        steps[variant] = step
    if args.ncu:
        for variant, step in steps.items():
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            step()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            print(f"{variant}: one step profiled")
        print(table(rows, ["variant", "rel. error after 3 steps", "input writes"]))
        return
    if args.device == "cuda":
        times = interleaved_gpu_times(steps)
    else:
        times = {k: v * 1e3 for k, v in median_times(steps, reps=args.reps).items()}
    host = host_times(steps) if args.device == "cuda" else {}
    for row in rows:
        row.insert(2, f"{times[row[0]]:.3f}")
        row.insert(3, f"{host[row[0]]:.1f}" if host else "")
    for row in rows:
        base = times.get("eager")
        row.insert(4, f"{base / times[row[0]]:.2f}x" if base else "")
    print(table(rows, ["variant", "rel. error after 3 steps", "ms / step", "host µs / step", "vs eager",
                       "input writes"]))
    if args.host_profile:
        for variant, step in steps.items():
            if variant == "eager":
                continue
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(50):
                step()
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(args.host_profile)
            print(f"{variant}: host profile of 50 steps\n" + out.getvalue().split("\n\n", 1)[-1])
    if args.profile and args.device == "cuda":
        for variant, step in steps.items():
            kernels = profiled_kernels(step, full_names=True)
            print(f"{variant}: {len(kernels)} kernels, {sum(kernels.values()):.1f} device µs a step")
            for name, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f}  {name[:40]}{'...' + name[-16:] if len(name) > 56 else name[40:]}")


if __name__ == "__main__":
    main()
