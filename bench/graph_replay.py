"""``ember.cuda_graph``'s two replays side by side on one GPU: the captured graph
(``replay='graph'``, ``cudaGraphLaunch``) and ember's own kernels launched again
(``replay='launches'``, runtime/launch_list.py), over the same captured work.

1. A chain of N one-kernel ember calls (a row softmax of a small tensor, N = 1, 2, 4, ...) in
   one step: µs from event to event as the ragged suite times a call, a synchronized call's
   wall time, and host and GPU µs per call issued back to back; outputs compared bit for bit.
   Where the launches stop paying sets ``cudagraphs.LAUNCH_LIMIT``.
2. The GIoU training step of issue 5 over batches of changing box counts, targets in
   ``collate``'s pinned host buffer, the two replays interleaved: a synchronized step's median,
   a step back to back; loss and gradient against float64.

    PYTHONPATH=. python bench/graph_replay.py [--reps 200] [--chain 1,2,4,8,16,32] [--batches 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table  # noqa: E402

import ember  # noqa: E402
from ember.ragged import collate, to_device  # noqa: E402
from ember.workloads.giou import make_batch, ragged_giou_loss  # noqa: E402
from ember.workloads.giou_bench import random_targets  # noqa: E402
from ember.workloads.timing import median_times  # noqa: E402

MODES = ("graph", "launches")


def synced_wall_us(fn: Callable[[], Any], reps: int) -> float:
    """Median µs of a call and a synchronize, from the host's clock (what a caller waits)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def back_to_back_us(fn: Callable[[], Any], calls: int) -> tuple[float, float]:
    """(host µs per call, GPU µs per call from event to event) for calls issued back to back."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    issued = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - issued) * 1e6 / calls
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def chain(lengths: list[int], reps: int) -> None:
    softmax = ember.compile(lambda x: torch.softmax(x * 1.5, dim=-1))
    x = torch.randn(64, 256, device="cuda")
    rows = []
    for n in lengths:
        def step(x: torch.Tensor, n: int = n) -> torch.Tensor:
            with torch.no_grad():
                for _ in range(n):
                    x = softmax(x)
            return x

        steps = {mode: ember.cuda_graph(step, static_args=(0,), replay=mode) for mode in MODES}
        outs = {mode: s(x).clone() for mode, s in steps.items()}
        entry = next(iter(steps["launches"].captures.values()))
        launched = entry.launches is not None
        same = torch.equal(outs["graph"], outs["launches"])
        calls = {mode: (lambda s=s: s(x)) for mode, s in steps.items()}
        event = median_times(calls, "cuda", reps)
        for mode, call in calls.items():
            wall = synced_wall_us(call, reps)
            host, gpu = back_to_back_us(call, reps)
            rows.append((n, mode, "yes" if mode == "graph" or launched else "no (graph)", f"{event[mode] * 1e6:.1f}",
                         f"{wall:.1f}", f"{host:.1f}", f"{gpu:.1f}", "yes" if same else "NO"))
    print(f"a chain of N one-kernel calls (row softmax 64 x 256 fp32), {reps} calls each, µs; "
          f"cudagraphs.LAUNCH_LIMIT = {ember.cudagraphs.LAUNCH_LIMIT}")
    print(table(rows, ["N", "replay", "as asked", "event", "synced wall", "host b2b", "GPU b2b", "same output"]))


def giou(batches: int, reps: int) -> None:
    loss_fn = ember.compile(ragged_giou_loss)

    def step(p: torch.Tensor, targets: Any) -> torch.Tensor:
        p.grad = None
        loss = loss_fn(p, targets)
        loss.backward()
        return loss

    pred_cpu, _, _ = make_batch(1024, torch.bfloat16)
    pred = pred_cpu.cuda().requires_grad_()
    host = [collate([(t,) for t in random_targets(1024, 1000 + i, torch.bfloat16)], ragged_fields=[0])[0]
            for i in range(batches)]
    steps = {mode: ember.cuda_graph(step, replay=mode) for mode in MODES}
    worst = dict.fromkeys(MODES, 0.0)
    for i, r in enumerate(host):  # every capacity captured, and each replay checked
        for mode, s in steps.items():
            loss = s(pred, r)
            if i % 10 == 0:
                p64 = pred.detach().double().requires_grad_()
                ref = ragged_giou_loss(p64, to_device(r, "cuda").to(torch.float64))
                ref.backward()
                err = ((pred.grad.double() - p64.grad).norm() / p64.grad.norm()).item()
                worst[mode] = max(worst[mode], err, abs(loss.item() - ref.item()) / abs(ref.item()))
    launched = {mode: sum(e.launches is not None for e in s.captures.values()) for mode, s in steps.items()}
    kernels = {mode: [len(e.launches) for e in s.captures.values() if e.launches is not None]
               for mode, s in steps.items()}
    synced: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(max(1, reps // batches)):
        for r in host:
            for mode, s in steps.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                s(pred, r)
                torch.cuda.synchronize()
                synced[mode].append((time.perf_counter() - start) * 1e6)
    rows = []
    for mode, s in steps.items():
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issued = time.perf_counter()
        for r in host:
            s(pred, r)
        host_us = (time.perf_counter() - issued) * 1e6 / len(host)
        end.record()
        torch.cuda.synchronize()
        rows.append((mode, f"{launched[mode]}/{len(s.captures)}", str(sorted(set(kernels[mode])) or "-"),
                     f"{statistics.median(synced[mode]):.1f}", f"{host_us:.1f}",
                     f"{start.elapsed_time(end) * 1e3 / len(host):.1f}", f"{worst[mode]:.1e}"))
    totals = [r.total_length for r in host]
    print(f"GIoU training step, bf16, batch 1024, {batches} batches of {min(totals)}..{max(totals)} boxes, "
          "targets pinned on the host, µs:")
    print(table(rows, ["replay", "captures launched", "kernels", "synced step (wall, median)", "host b2b",
                       "step b2b", "worst rel err"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--chain", default="1,2,4,8,16,32")
    p.add_argument("--batches", type=int, default=100)
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    chain([int(n) for n in args.chain.split(",") if n], args.reps)
    giou(args.batches, args.reps)


if __name__ == "__main__":
    main()
