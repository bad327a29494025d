"""Where a graphed call of the ragged suite spends its time: the suite's event-timed call, the
bare ``CUDAGraph.replay()`` of the same graph, a one-kernel graph (the floor of any graphed
call), the host's share, and the timeline of the work inside one replay (kernels, copies and
fills, with the idle time between them).

    PYTHONPATH=. python bench/graph_gaps.py [--cases softmax,pool,ce] [--reps 50]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ragged_suite as suite  # noqa: E402

from ember.workloads.timing import cuda_activity, median_times  # noqa: E402


def event_us(fn: Callable[[], Any], reps: int) -> float:
    """The suite's protocol: events around one call after a synchronize, median µs."""
    return median_times({"call": fn}, "cuda", reps)["call"] * 1e6


def host_us(fn: Callable[[], Any], calls: int = 200) -> float:
    """Host µs per call, calls issued back to back (the GPU may lag behind)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e6 / calls


def timeline(fn: Callable[[], Any]) -> list[tuple[str, float, float]]:
    """(name, start µs after the first, duration µs) of the GPU work of one call."""
    raw = cuda_activity(fn)
    t0 = raw[0][0] if raw else 0
    return [(name[:60], (s - t0) / 1e3, d / 1e3) for s, d, name in raw]


def one_kernel_graph() -> Callable[[], None]:
    x = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        x.add_(1)
    return graph.replay


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="softmax,pool,ce")
    p.add_argument("--reps", type=int, default=50)
    args = p.parse_args()
    floor = one_kernel_graph()
    for _ in range(5):
        floor()
    rows = [("one-kernel graph", "replay", event_us(floor, args.reps), host_us(floor), None)]
    lines = []
    for name in args.cases.split(","):
        case = suite.make_case(name, suite.GPU_SIZES, torch.device("cuda"), torch.bfloat16)
        fwd, train = suite._ember_graph_steps(case, case.grad_ragged)
        steps = {"forward": fwd, "train": train}
        for kind, step in steps.items():
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            graph_step = step.__closure__ and next(c.cell_contents for c in step.__closure__
                                                   if hasattr(c.cell_contents, "captures"))
            entry = next(iter(graph_step.captures.values()))
            events = timeline(entry.graph.replay)
            span = events[-1][1] + events[-1][2] if events else 0.0
            busy = sum(d for _, _, d in events)
            rows.append((name, kind, event_us(step, args.reps), host_us(step), (span, busy)))
            rows.append((name, kind + " (bare replay)", event_us(entry.graph.replay, args.reps),
                         host_us(entry.graph.replay), None))
            lines.append(f"{name} {kind}: {len(events)} pieces of GPU work in one replay")
            lines += [f"    +{s:8.1f} us  {d:8.1f} us  {n}" for n, s, d in events]
        del case
        torch.cuda.empty_cache()
    print("| case | call | event µs | host µs | GPU span / busy µs |")
    print("|---|---|---|---|---|")
    for case, kind, ev, host, gpu in rows:
        gpu_text = f"{gpu[0]:.1f} / {gpu[1]:.1f}" if gpu else "-"
        print(f"| {case} | {kind} | {ev:.1f} | {host:.1f} | {gpu_text} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
