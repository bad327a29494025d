"""Warm start: a graph compiled again in the same process (after ``torch._dynamo.reset()``, or the
same program traced twice) reuses its plan instead of lowering and planning it again."""

from __future__ import annotations

import torch

import ember
from ember import driver
from ember.config import Config

from .helpers import assert_same


def fn(x, w):
    return torch.relu(x) * w + 1.2345


def test_recompiling_a_graph_reuses_its_plan(monkeypatch):
    planned = []
    original = driver.plan
    monkeypatch.setattr(driver, "plan", lambda graph, cfg: planned.append(graph) or original(graph, cfg))
    x, w = torch.randn(6, 7), torch.randn(7)
    assert_same(ember.compile(fn)(x, w), fn(x, w))
    torch._dynamo.reset()
    before = len(planned)
    assert_same(ember.compile(fn)(x, w), fn(x, w))
    assert len(planned) == before  # the same graph over the same shapes: planned once
    # other shapes are another graph
    torch._dynamo.reset()
    y, v = torch.randn(3, 5), torch.randn(5)
    assert_same(ember.compile(fn)(y, v), fn(y, v))
    assert len(planned) == before + 1
    # a report shows the IR after every pass: that compile runs the whole pipeline
    torch._dynamo.reset()
    report = ember.Report()
    assert_same(ember.compile(fn, report=report)(x, w), fn(x, w))
    assert len(planned) == before + 2
    assert len(report.graphs[0].passes) > 1 and report.kernels[0].source


def _traced(module: torch.nn.Module) -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(module)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = torch.empty(4, 4)
    return gm


def test_fingerprint_covers_dtypes_and_settings_and_skips_constants():
    class Add(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class WithBuffer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("b", torch.ones(4))

        def forward(self, x):
            return x + self.b

    gm = _traced(Add())
    key = driver._fingerprint(gm, "inference", Config())
    assert key == driver._fingerprint(_traced(Add()), "inference", Config())
    assert key != driver._fingerprint(gm, "forward", Config())
    assert key != driver._fingerprint(gm, "inference", Config(fusion=False))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["val"] = torch.empty(4, 4, dtype=torch.float64)
    assert key != driver._fingerprint(gm, "inference", Config())
    # a tensor constant's values are not part of the key: such graphs are always planned
    assert driver._fingerprint(_traced(WithBuffer()), "inference", Config()) is None
