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
    monkeypatch.setattr(driver, "plan", lambda graph, cfg, **kw: planned.append(graph) or original(graph, cfg, **kw))
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


def test_dynamo_skips_timing_the_guards_of_ember_frames(monkeypatch):
    """Dynamo times each new guard set after evicting the CPU caches (~20 ms a frame, for its
    metrics only): not for ember's frames, unless profile_guards asks; other backends' frames
    are timed as before, and the guards still tell inputs apart."""
    from ember.api import ember_backend
    from ember.frontend import guard_profile

    x, w = torch.randn(6, 7), torch.randn(7)
    if not guard_profile._install():
        import pytest
        pytest.skip("this torch does not time its guards")
    timed = []
    monkeypatch.setattr(guard_profile, "_measure", lambda *args: timed.append(args) or 1.0)

    def compile_and_run(compiler, *args):
        torch._dynamo.reset()
        before = len(timed)
        compiled = compiler(fn)
        assert_same(compiled(*args), fn(*args))
        return len(timed) - before

    assert compile_and_run(ember.compile, x, w) == 0
    assert compile_and_run(lambda f: torch.compile(f, backend="eager"), x, w) == 1
    # the backend torch.compile(backend="ember") names (by its function: the name needs ember installed)
    assert compile_and_run(lambda f: torch.compile(f, backend=ember_backend), x, w) == 0
    assert compile_and_run(lambda f: ember.compile(f, options={"profile_guards": True}), x, w) == 1
    # the next frame of another backend right after ember's (compile ids repeat after a reset)
    torch._dynamo.reset()
    ember.compile(fn)(x, w)
    assert compile_and_run(lambda f: torch.compile(f, backend="eager"), x, w) == 1

    # guards are still built and checked: a new dtype and a new rank compile again, and are right
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    before = len(timed)
    compiled = ember.compile(fn)
    for args in ((x, w), (x.double(), w.double()), (torch.randn(2, 3, 7), w)):
        assert_same(compiled(*args), fn(*args))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3
    assert len(timed) == before
