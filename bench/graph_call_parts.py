"""Host time of each part of an ``ember.cuda_graph`` call of the GIoU training step, targets in
``collate``'s pinned host buffer (what ``bench/giou_step.py`` times as a whole), to see which
part of a call is worth shortening.

    python bench/graph_call_parts.py [--batch 1024] [--calls 200]

Each part runs ``--calls`` times in a row, then synchronizes; median of 15 rounds, µs per call.
"replay, one after a sync" is the host time of a single replay issued to an idle GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ember  # noqa: E402
from ember.cudagraphs import _copy_in, _packed_layout  # noqa: E402
from ember.ragged import collate  # noqa: E402
from ember.runtime.driver_copies import _libcuda  # noqa: E402
from ember.workloads.giou import make_batch, ragged_giou_loss  # noqa: E402
from ember.workloads.giou_bench import random_targets  # noqa: E402


def per_call(fn, calls: int, rounds: int = 15) -> float:
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    pred = make_batch(args.batch, torch.bfloat16)[0].cuda().requires_grad_()
    loss_fn = ember.compile(ragged_giou_loss)

    def step(p, targets):
        p.grad = None
        loss = loss_fn(p, targets)
        loss.backward()
        return loss

    batches = [collate([(t,) for t in random_targets(args.batch, 1000 + i, torch.bfloat16)], ragged_fields=[0])[0]
               for i in range(20)]
    graphed = ember.cuda_graph(step)
    for b in batches:
        graphed(pred, b)
    torch.cuda.synchronize()
    batch = batches[0]
    leaves = [pred, batch]
    capacities = graphed._capacities(leaves)
    key = graphed._key(leaves, 2, capacities)
    entry = graphed.captures[key]
    lib = _libcuda()
    stream = torch._C._cuda_getCurrentRawStream(0)
    packed, (start, values_start) = entry.packed[1]
    nbytes = values_start + batch.values.nbytes - start
    dst, src = packed.data_ptr() + start, batch.offsets.data_ptr()

    def one_replay_after_sync() -> None:
        torch.cuda.synchronize()
        t = time.perf_counter()
        entry.graph.replay()
        single.append((time.perf_counter() - t) * 1e6)

    single: list[float] = []
    parts = {
        "capacities": lambda: graphed._capacities(leaves),
        "key": lambda: graphed._key(leaves, 2, capacities),
        "_packed_layout": lambda: _packed_layout(batch),
        "cuMemcpyHtoDAsync alone": lambda: lib.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream),
        "_copy_in": lambda: _copy_in(entry, leaves, graphed._copier),
        "replay": entry.graph.replay,
        "_run (copy in, replay, gradients)": lambda: graphed._run(entry, leaves),
        "whole call": lambda: graphed(pred, batch),
    }
    print(f"# {torch.cuda.get_device_name()}, host µs per call, {args.calls} calls in a row")
    for _ in range(2):
        row = {name: round(per_call(fn, args.calls), 2) for name, fn in parts.items()}
        single.clear()
        for _ in range(200):
            one_replay_after_sync()
        row["replay, one after a sync"] = round(statistics.median(single), 2)
        print(row, flush=True)
    print("a synchronized call's timeline, median µs:", synced_timeline(graphed, entry, leaves))


def synced_timeline(graphed, entry, leaves, calls: int = 200) -> dict[str, float]:
    """Where a call issued to an idle GPU spends its time: host time of the key, the copy in and
    the replay; GPU time from the call's start to the copy's end and from there to the graph's
    end (events between the parts); and the synchronize's wait."""
    times: dict[str, list[float]] = {}
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        events[0].record()
        graphed._key(leaves, 2, graphed._capacities(leaves))
        t1 = time.perf_counter()
        _copy_in(entry, leaves, graphed._copier)
        t2 = time.perf_counter()
        events[1].record()
        entry.graph.replay()
        t3 = time.perf_counter()
        events[2].record()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        for name, value in (("host: key", t1 - t0), ("host: copy in", t2 - t1), ("host: replay", t3 - t2),
                            ("host: synchronize", t4 - t3), ("host: whole", t4 - t0)):
            times.setdefault(name, []).append(value * 1e6)
        times.setdefault("GPU: start to copied", []).append(events[0].elapsed_time(events[1]) * 1e3)
        times.setdefault("GPU: copied to graph end", []).append(events[1].elapsed_time(events[2]) * 1e3)
    return {name: round(statistics.median(v), 1) for name, v in times.items()}


if __name__ == "__main__":
    main()
