"""Where a GIoU training step's time goes, per variant: wall time of a synchronized step, the
GPU time of its kernels, and the host's top functions (cProfile) for ember's ragged step; then
whether the step can be captured in a CUDA graph and what a replay costs; then ember's ragged
step through ``ember.cuda_graph`` over batches with different box counts (one capture serves
them all: kernels read the box count from the offsets on the device), each checked against
float64, with the recompiles and captures it took, for targets already on the GPU and for
targets handed over in ``collate``'s pinned host buffer; then the targets' copy alone.

    PYTHONPATH=. python bench/giou_step.py [--batch 1024] [--steps 200] [--top 20] [--batches 100]
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
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import synced_us, table  # noqa: E402

import ember  # noqa: E402
from ember.cudagraphs import _copy_in  # noqa: E402
from ember.ragged import Ragged, collate, to_device  # noqa: E402
from ember.workloads.giou import make_batch, padded_giou_loss, ragged_giou_loss  # noqa: E402
from ember.workloads.giou_bench import pack, random_targets  # noqa: E402
from ember.workloads.timing import wall_time  # noqa: E402


def kernel_us(step, steps: int) -> tuple[float, int]:
    """(GPU µs of the kernels of one step, kernels per step) under the profiler."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in events) / steps, len(events) // steps


def host_top(step, steps: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def graphed(step, warmup: int = 3):
    """``step`` captured in a CUDA graph (after warm-up on a side stream); returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--batches", type=int, default=100)
    args = p.parse_args()
    pred_cpu, targets, padded_cpu = make_batch(args.batch, torch.bfloat16)
    pred = pred_cpu.cuda().requires_grad_()
    padded = padded_cpu.cuda()
    ragged = pack(targets, torch.device("cuda"))
    pred64 = pred.detach().double().requires_grad_()
    padded_giou_loss(pred64, padded.double()).backward()

    fns = {
        "eager(pad)": lambda p: padded_giou_loss(p, padded),
        "inductor(pad)": (lambda c: (lambda p: c(p, padded)))(torch.compile(padded_giou_loss)),
        "ember(pad)": (lambda c: (lambda p: c(p, padded)))(ember.compile(padded_giou_loss)),
        "ember(ragged)": (lambda c: (lambda p: c(p, ragged)))(ember.compile(ragged_giou_loss)),
    }

    def train(fn):
        def step():
            pred.grad = None
            fn(pred).backward()
        return step

    rows = []
    for name, fn in fns.items():
        step = train(fn)
        for _ in range(5):
            step()
        ember.wait_for_kernels()
        err = ((pred.grad.double() - pred64.grad).norm() / pred64.grad.norm()).item()
        wall = synced_us(step, args.steps)
        kern, launches = kernel_us(step, 20)
        rows.append((name, f"{wall:.0f}", f"{kern:.1f}", launches, f"{err:.1e}"))
        if name == "ember(ragged)":
            print(f"host profile of {name}, {args.steps} steps:\n" + host_top(step, args.steps, args.top))
    print(table(rows, ["variant", "step us (synced)", "kernels us", "kernels", "grad rel err"]))

    # CUDA graph capture of the whole step, at this batch's box count
    rows = []
    for name in ("inductor(pad)", "ember(pad)", "ember(ragged)"):
        step = train(fns[name])
        try:
            replay = graphed(step)
            replay()
            torch.cuda.synchronize()
            err = ((pred.grad.double() - pred64.grad).norm() / pred64.grad.norm()).item()
            rows.append((name, f"{synced_us(replay, args.steps):.1f}", f"{err:.1e}", ""))
        except Exception as e:  # noqa: BLE001 -- reported in the table
            rows.append((name, "-", "-", f"{type(e).__name__}: {str(e)[:100]}"))
    print("the whole step captured in a CUDA graph, one replay:")
    print(table(rows, ["variant", "replay us (synced)", "grad rel err", "error"]))
    varying_box_counts(pred, args.batches)


def varying_box_counts(pred: torch.Tensor, batches: int) -> None:
    """ember's ragged step through ember.cuda_graph, a different box count every batch: targets
    moved to the GPU first (``to_device``, then a copy into the graph's buffers), and targets
    handed over in ``collate``'s pinned host buffer (copied straight into the graph's buffers)."""
    loss_fn = ember.compile(ragged_giou_loss)

    def step(p, targets):
        p.grad = None
        loss = loss_fn(p, targets)
        loss.backward()
        return loss

    host = [collate([(t,) for t in random_targets(pred.shape[0], 1000 + i, torch.bfloat16)], ragged_fields=[0])[0]
            for i in range(batches)]
    data = {"gpu": [to_device(r, "cuda") for r in host], "host (pinned)": host}
    totals = [r.total_length for r in host]
    rows, work = [], {}
    for where, batch_list in data.items():
        graphed = ember.cuda_graph(step)
        graphed(pred, batch_list[0])  # compiles and captures
        torch.cuda.synchronize()
        graphs = ember.stats()["graphs_compiled"]
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        worst, times = 0.0, []
        for i, r in enumerate(batch_list):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = graphed(pred, r)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
            if i % 10 == 0:  # every tenth batch against float64
                p64 = pred.detach().double().requires_grad_()
                ref = ragged_giou_loss(p64, to_device(r, "cuda").to(torch.float64))
                ref.backward()
                err = ((pred.grad.double() - p64.grad).norm() / p64.grad.norm()).item()
                worst = max(worst, err, abs(loss.item() - ref.item()) / abs(ref.item()))
        for r in batch_list:  # every capacity captured before timing
            graphed(pred, r)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        issued = time.perf_counter()
        for r in batch_list:  # back to back, as a training loop runs them (no sync between steps)
            graphed(pred, r)
        host_us = (time.perf_counter() - issued) * 1e6 / len(batch_list)
        end.record()
        torch.cuda.synchronize()
        pipelined = start.elapsed_time(end) * 1e3 / len(batch_list)
        entry = next(iter(graphed.captures.values()))
        replay_only = synced_us(entry.graph.replay, 50)
        parts = {"replay": lambda e=entry: e.graph.replay(),
                 "copy in": lambda e=entry, b=batch_list, g=graphed: _copy_in(e, [pred, b[0]], g._copier),
                 "copy in with copy_": lambda e=entry, b=batch_list: _copy_in(e, [pred, b[0]]),
                 "key": lambda g=graphed, b=batch_list: g._key([pred, b[0]], 2, g._capacities([pred, b[0]]))}
        split = []
        for name, part in parts.items():  # host time of each part of a call, 100 in a row
            torch.cuda.synchronize()
            issued = time.perf_counter()
            for _ in range(100):
                part()
            split.append(f"{name} {(time.perf_counter() - issued) * 1e4:.1f}")
            torch.cuda.synchronize()
        print(f"host us per call, targets on {where}, by part: " + ", ".join(split))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for r in batch_list[:20]:
                graphed(pred, r)
            torch.cuda.synchronize()
        kinds: dict[str, list[float]] = {}  # name -> [count, GPU µs]
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                seen = kinds.setdefault(e.name, [0, 0.0])
                seen[0] += 1
                seen[1] += e.device_time
        work[where] = kinds
        rows.append((f"targets on {where}", f"{pipelined:.1f}", f"{host_us:.1f}", f"{statistics.median(times):.1f}",
                     f"{max(times):.1f}",
                     f"{replay_only:.1f}", len(graphed.captures), ember.stats()["graphs_compiled"] - graphs,
                     torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames, f"{worst:.1e}"))
        if graphed.exact_reason:
            print("captured per box count:", graphed.exact_reason)
        if where != "gpu":
            host_step, host_entry = graphed, entry
    print(f"ember.cuda_graph over {batches} batches, boxes {min(totals)}..{max(totals)}:")
    print(table(rows, ["ember(ragged), cuda_graph", "step us back to back", "host us per call",
                       "step us median (synced)", "max",
                       "replay alone", "captures", "ember graphs compiled", "dynamo graphs",
                       "worst rel err (loss, grad)"]))
    for where, kinds in work.items():
        print(f"device work per step, targets on {where} (20 steps):",
              "; ".join(f"{n / 20:g} x {k[:140]} ({us / max(n, 1):.1f} µs each)"
                        for k, (n, us) in sorted(kinds.items())))
    targets_copy(host[0], pred, host_step, host_entry)


def targets_copy(batch: Ragged, pred: torch.Tensor, step, entry, reps: int = 200) -> None:
    """A batch's targets from collate's pinned buffer to the GPU, synchronized: ``to_device``
    (one copy of the packed buffer, plus rebuilding the Ragged), the bare copy alone, one copy
    each of values and offsets with ``copy_``, and what ``ember.cuda_graph`` does with host
    targets (the packed batch in one copy into its buffers, through the driver)."""
    dev = torch.device("cuda")
    whole = torch.empty(0, dtype=torch.uint8).set_(batch.values.untyped_storage())
    values = torch.empty((4097, *batch.feature_shape), dtype=batch.dtype, device=dev)
    offsets = torch.empty_like(batch.offsets, device=dev)

    def into_graph_buffers():
        values.narrow(0, 0, batch.total_length).copy_(batch.values, non_blocking=True)
        offsets.copy_(batch.offsets, non_blocking=True)

    cases = [("to_device(batch)", lambda: to_device(batch, dev)),
             ("packed buffer .to(cuda) alone", lambda: whole.to(dev, non_blocking=True)),
             ("values and offsets, copy_ each", into_graph_buffers),
             ("cuda_graph's copy-in (driver, 1 copy)", lambda: _copy_in(entry, [pred, batch], step._copier))]
    rows = [(name, f"{wall_time(fn, dev, reps) * 1e6:.1f}") for name, fn in cases]
    print(f"targets to the GPU ({whole.numel()} bytes, pinned: {batch.values.is_pinned()}), "
          f"host wall us incl. synchronize, median of {reps}:")
    print(table(rows, ["copy", "us"]))


if __name__ == "__main__":
    main()
