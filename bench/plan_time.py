"""How long ember's fusion planner takes on large graphs: a GPT's training step and a stack of
GroupNorms (whose backward asks for buffers one attempt at a time), on the CPU.

For each graph: its nodes, the planner's attempts, the kernels it built (with the builds an
attempt reused from an earlier one left out), the seconds spent planning, and the first call's
wall time (Dynamo, AOTAutograd, lowering, planning, C++ compile or cache load).

    PYTHONPATH=. python bench/plan_time.py [--layers 4] [--norms 12]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

import ember
import ember.driver as driver
from bench.common import table
from bench.gpt_step import GPT
from ember.schedule import fusion


def _instrumented() -> list[dict]:
    """Records every plan: its graph's name and nodes, attempts, kernel builds and seconds."""
    records: list[dict] = []
    original_plan, original_form, original_build = driver.plan, fusion.Planner.form_groups, fusion.KernelBuilder.build
    current: dict = {}

    def form_groups(self):
        current["attempts"] += 1
        return original_form(self)

    def build(self):
        current["builds"] += 1
        return original_build(self)

    def plan(graph, cfg, *args, **kwargs):  # (the planner's own arguments: gpu, hints)
        current.update(graph=graph.name, nodes=len(graph.nodes), attempts=0, builds=0)
        start = time.perf_counter()
        schedule = original_plan(graph, cfg, *args, **kwargs)
        records.append(dict(current, seconds=time.perf_counter() - start, kernels=len(schedule.kernels)))
        return schedule

    driver.plan, fusion.Planner.form_groups, fusion.KernelBuilder.build = plan, form_groups, build
    return records


def _group_norms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, norms: int) -> torch.Tensor:
    out = x
    for i in range(norms):
        out = F.group_norm(out, (1, 2, 4, 8)[i % 4], w, b).sin() + out
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--norms", type=int, default=12)
    args = parser.parse_args()
    records = _instrumented()
    torch.manual_seed(0)
    cases = []

    model = GPT(vocab=512, width=64, heads=4, layers=args.layers, max_len=64)
    idx, targets = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    step = ember.compile(lambda i, t: model(i, t), options={"aot_cache": False})
    cases.append((f"gpt {args.layers} layers", lambda: step(idx, targets).backward()))

    x = torch.randn(2, 8, 5, 3, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    norms = ember.compile(lambda *a: _group_norms(*a, args.norms), options={"aot_cache": False})
    cases.append((f"{args.norms} group norms", lambda: norms(x, w, b).sum().backward()))

    rows = []
    for name, first_call in cases:
        before = len(records)
        start = time.perf_counter()
        first_call()
        wall = time.perf_counter() - start
        for r in records[before:]:
            rows.append([name, r["graph"], r["nodes"], r["attempts"], r["builds"], r["kernels"],
                         f"{r['seconds']:.2f}", f"{wall:.1f}"])
    print(table(rows, ["case", "graph", "nodes", "attempts", "builds", "kernels", "plan s", "first call s"]))


if __name__ == "__main__":
    main()
