"""Where the host time of a small call goes: cProfile of forward and forward + backward steps on a
tiny input (the GPU idles, so wall time is host time), Inductor next to ember.

    python bench/host_profile.py [--case rmsnorm] [--steps 2000] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_fusion import cross_entropy, layer_norm, rmsnorm, softmax  # noqa: E402

import ember  # noqa: E402

SMALL = {
    "rmsnorm": (rmsnorm, lambda: (torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda"))),
    "softmax": (softmax, lambda: (torch.randn(64, 256, device="cuda"),)),
    "layernorm": (layer_norm, lambda: (torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda"),
                                       torch.randn(256, device="cuda"))),
    "cross_entropy": (cross_entropy, lambda: (torch.randn(64, 256, device="cuda"),
                                              torch.randint(0, 256, (64,), device="cuda"))),
}


def step_of(f, inputs, train: bool):
    if not train:
        def fwd():
            with torch.no_grad():
                f(*inputs)
        return fwd
    grads = [x for x in inputs if x.is_floating_point()]

    def step():
        for x in grads:
            x.grad = None
        out = f(*inputs)
        out.backward(torch.ones_like(out) if out.dim() else None)
    return step


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="rmsnorm")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--backends", default="triton")
    args = p.parse_args()
    fn, make = SMALL[args.case]
    variants = {"eager": fn, "inductor": torch.compile(fn)}
    for b in args.backends.split(","):
        variants[f"ember-{b}"] = ember.compile(fn, options={"gpu_backend": b})
    for train in (False, True):
        inputs = [x.requires_grad_() if x.is_floating_point() and train else x for x in make()]
        kind = "fwd+bwd" if train else "fwd"
        steps = {name: step_of(f, inputs, train) for name, f in variants.items()}
        samples: dict[str, list[float]] = {name: [] for name in steps}
        for step in steps.values():
            for _ in range(50):
                step()
        # interleaved rounds: the host's speed drifts, and it drifts for every variant alike
        for _ in range(args.rounds):
            for name, step in steps.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.steps // args.rounds):
                    step()
                torch.cuda.synchronize()
                samples[name].append((time.perf_counter() - start) / (args.steps // args.rounds) * 1e6)
        print(f"{args.case} {kind}, host us per call (median of {args.rounds} rounds): " + ", ".join(
            f"{name} {statistics.median(v):.1f}" for name, v in samples.items()), flush=True)
        for name, step in steps.items():
            if args.top and (name.startswith("ember") or name == "inductor"):
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.steps // 4):
                    step()
                prof.disable()
                torch.cuda.synchronize()
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
                lines = [ln for ln in text.getvalue().splitlines() if ln.strip()][3:]
                print(f"  {kind} {name}, top functions by own time:")
                print("\n".join("    " + ln for ln in lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
