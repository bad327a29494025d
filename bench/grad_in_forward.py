"""The gradient in the forward (frontend/partition.py) against min-cut, on the padded GIoU loss.

    python bench/grad_in_forward.py [--batch 1024] [--reps 30] [--dtype float32]

Forward + backward (gradient to the predictions) of ``padded_giou_loss`` compiled by ember with
``grad_in_forward`` on and off, and eager: the loss and gradient against a float64 reference, the
kernels of each compiled graph, then median times of interleaved runs (whole steps, then forward
and backward apart).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_times, rel_error, table  # noqa: E402

import ember  # noqa: E402
from ember.workloads.giou import make_batch, padded_giou_loss  # noqa: E402


def step(fn, pred, padded):
    pred.grad = None
    loss = fn(pred, padded)
    loss.backward()
    return loss.detach(), pred.grad


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"# {machine()}, {time.strftime('%Y-%m-%d')}, padded GIoU loss, batch {args.batch}, {args.dtype}")
    pred, _targets, padded = make_batch(args.batch, dtype)
    ref_pred = pred.double().requires_grad_()
    ref = step(padded_giou_loss, ref_pred, padded.double())

    variants, rows = {"eager": padded_giou_loss}, []
    for on in (False, True):
        report = ember.Report()
        fn = ember.compile(padded_giou_loss, options={"grad_in_forward": on}, report=report)
        x = pred.clone().requires_grad_()
        error = rel_error(step(fn, x, padded), ref)
        kernels = {g.kind: len(g.kernels) + len(g.fallbacks) for g in report.graphs}
        name = "ember, gradient in forward" if on else "ember, min-cut"
        variants[name] = fn
        rows.append([name, f"{kernels.get('forward', 0)} / {kernels.get('backward', 0)}", f"{error:.1e}"])
    print(table(rows, ["variant", "kernels fwd / bwd", "rel. error vs fp64"]))

    inputs = {name: pred.clone().requires_grad_() for name in variants}
    times = median_times({name: (lambda fn=fn, x=inputs[name]: step(fn, x, padded)) for name, fn in variants.items()},
                         reps=args.reps)
    fwd, bwd = split_times(variants, inputs, padded, args.reps)
    base = times["ember, min-cut"]
    print(table([[name, f"{fwd[name] * 1e3:.3f} ms", f"{bwd[name] * 1e3:.3f} ms", f"{t * 1e3:.3f} ms",
                  f"{base / t:.2f}x"] for name, t in times.items()],
                ["variant", "fwd", "bwd", "fwd+bwd", "vs ember min-cut"]))
    return 0


def split_times(variants, inputs, padded, reps):
    """Median forward and backward times of each variant, from interleaved steps."""
    fwd, bwd = {name: [] for name in variants}, {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            x = inputs[name]
            x.grad = None
            start = time.perf_counter()
            loss = fn(x, padded)
            middle = time.perf_counter()
            loss.backward()
            end = time.perf_counter()
            fwd[name].append(middle - start)
            bwd[name].append(end - middle)
    return ({k: statistics.median(v) for k, v in fwd.items()}, {k: statistics.median(v) for k, v in bwd.items()})


if __name__ == "__main__":
    raise SystemExit(main())
