"""The planner's shortcuts change no plan: kernels reused across attempts, cached subtrees and the
pruned dependency walk give the schedule a planner without them gives.

Planning retries after each ``NeedsBuffer`` and ``Conflict``; a group_norm backward takes tens of
attempts. The tests plan graphs captured from real compiles with the shortcuts, without them, and
with the dependency walk's fallback for graphs too large for reach sets, and compare the rendered
kernels, steps and buffers; the pruned walk is also checked against a full walk pair by pair."""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F

import ember
import ember.driver as driver
from ember.codegen.cpp import render_module
from ember.schedule import cycles, fusion

from .helpers import assert_same


def _captured_plans(monkeypatch, fn, *args):
    """(graph, cfg) of every graph ember plans while compiling and running ``fn`` (and its
    backward, when it returns a tensor that needs a gradient)."""
    seen = []
    original = driver.plan

    def recording(graph, cfg, **kw):
        seen.append((graph, cfg))
        return original(graph, cfg, **kw)

    monkeypatch.setattr(driver, "plan", recording)
    monkeypatch.setattr(driver, "_planned", OrderedDict())  # (plans of an earlier compile: none)
    torch._dynamo.reset()
    out = ember.compile(fn, options={"aot_cache": False})(*args)
    outs = out if isinstance(out, tuple) else (out,)
    if any(o.requires_grad for o in outs):
        sum(o.sum() for o in outs).backward()
    assert_same(out, fn(*[a.detach() for a in args]))
    return seen


class _NoShortcuts(fusion.Planner):
    """The planner as it was: every attempt builds every kernel, walks every subtree, and the
    dependency walk visits all of a node's inputs."""

    def subtree(self, root):
        return self._walk_subtree(root)

    def _build(self, spec, infos, index):
        kernel = self._build_kernel(spec, fusion.RecordedReads(infos), [self.subtree(r) for r in spec.roots])
        kernel.name = self._kernel_name(kernel, index)
        return kernel

    def _depends(self, node, targets, direct_ok, inside=frozenset()):
        self._reach = dict.fromkeys(self.order, -1)  # (every node leads to every target)
        return super()._depends(node, targets, direct_ok, inside)


def _fingerprint(schedule) -> str:
    steps = [f"{type(s).__name__} {getattr(getattr(s, 'kernel', None), 'name', '')}" for s in schedule.steps]
    buffers = [f"{node!r} {info.name} {info.strides}" for node, info in schedule.buffers.items()]
    return "\n".join(steps + buffers) + "\n" + render_module(schedule.kernels)


def _group_norms(x, w, b):
    # (each norm's backward asks for buffers one attempt at a time: a dozen attempts)
    return sum(F.group_norm(x * i, g, w, b).sin() for i, g in enumerate((1, 2, 4, 8)))


def _losses(x, y):
    return F.cross_entropy(x.log_softmax(-1) * 2, y) + F.layer_norm(x, x.shape[-1:]).var()


def _attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return (s.softmax(-1) @ v).relu().mean(-1) - s.amax(-1)


def _kernels_apart(x):
    # grouping w with the sum over o * w, and w * exp(x - o) with logsumexp, would make two
    # kernels that need each other (the dependency walk finds it)
    o = torch.logsumexp(x, -2)
    w = torch.linspace(-1, 2, 5, dtype=o.dtype)
    return (o * w).sum(), w * torch.exp(x - o)


def _two_layers(x, w1, b1, w2, b2, y, g):
    # the gradient in the forward: a cycle through ATen's matmul the dependency walk must see
    return F.linear(F.linear(x, w1, b1).relu(), w2, b2).sum() + (y * g).sum()


CASES = [
    (_group_norms, lambda: (torch.randn(2, 8, 5, 3, requires_grad=True), torch.randn(8, requires_grad=True),
                           torch.randn(8, requires_grad=True))),
    (_losses, lambda: (torch.randn(7, 11, requires_grad=True), torch.randint(0, 11, (7,)))),
    (_attention, lambda: tuple(torch.randn(2, 5, 8, requires_grad=True) for _ in range(3))),
    (_kernels_apart, lambda: (torch.randn(5, 5, dtype=torch.float64),)),
    (_two_layers, lambda: [a.requires_grad_(r) for a, r in zip(
        [torch.randn(3, 6), torch.randn(6, 6), torch.randn(6), torch.randn(2, 6), torch.randn(2), torch.randn(8, 20),
         torch.randn(20)], [False, True, True, True, True, False, True])]),
]


def test_plans_are_those_of_a_planner_without_shortcuts(monkeypatch):
    plans = [p for fn, make in CASES for p in _captured_plans(monkeypatch, fn, *make())]
    builds = {"with": 0, "without": 0, "no_reach": 0}
    original_build = fusion.KernelBuilder.build
    counting = "with"

    def counted(self):
        builds[counting] += 1
        return original_build(self)

    monkeypatch.setattr(fusion.KernelBuilder, "build", counted)
    retried, fast_plans = 0, []
    for graph, cfg in plans:
        counting = "with"
        fast = fusion.Planner(graph, cfg).plan()
        fast_plans.append(fast)
        counting = "without"
        slow = _NoShortcuts(graph, cfg).plan()
        assert _fingerprint(fast) == _fingerprint(slow), graph.name
        retried += fast.attempts > 1
        assert slow.attempts == fast.attempts and slow.reused == 0
        # a graph too large for reach sets: the walk skips only what precedes every target
        counting = "no_reach"
        with monkeypatch.context() as m:
            m.setattr(cycles, "REACH_LIMIT", 0)
            assert _fingerprint(fusion.Planner(graph, cfg).plan()) == _fingerprint(slow), graph.name
    # some graphs retried (a backward's NeedsBuffer), and the retries rebuilt fewer kernels
    assert retried >= 2
    assert builds["with"] < builds["without"]
    assert builds["without"] - builds["with"] == sum(p.reused for p in fast_plans)


def test_subtrees_follow_the_buffers(monkeypatch):
    ((graph, cfg),) = _captured_plans(monkeypatch, lambda a: ((a.exp() + 1) * 2).sum(-1), torch.randn(4, 6))
    planner = fusion.Planner(graph, cfg)
    (root,) = planner.buffered
    inlined = planner.subtree(root)
    add = next(n for n in inlined if n.origin and "add" in n.origin)
    planner.buffered.add(add)  # what a NeedsBuffer does: the root now reads the sum's buffer
    assert add not in planner.subtree(root) and len(planner.subtree(root)) < len(inlined)
    planner.buffered.discard(add)
    assert planner.subtree(root) == inlined


def test_the_pruned_dependency_walk_answers_as_a_full_walk(monkeypatch):
    # every pair of a training graph's buffered nodes (and ATen calls), both ways of reading
    # directly, with and without the other buffers counted as inside the kernel
    plans = _captured_plans(monkeypatch, _two_layers, *CASES[-1][1]())
    plans += _captured_plans(monkeypatch, _attention, *CASES[2][1]())
    answers = {True: 0, False: 0}
    for graph, cfg in plans:
        planner = fusion.Planner(graph, cfg)
        planner.plan()
        full = _NoShortcuts(graph, cfg)
        full.buffered |= planner.buffered
        nodes = sorted(planner.buffered | {n for n in graph.nodes if n.op in fusion.BUFFER_OPS},
                       key=planner.order.__getitem__)
        for inside in (frozenset(), frozenset(planner.buffered)):
            for a in nodes:
                for b in nodes:
                    for direct_ok in (True, False):
                        want = full._depends(a, {b}, direct_ok, inside)
                        assert planner._depends(a, {b}, direct_ok, inside) == want, (a, b)
                        answers[want] += 1
        with monkeypatch.context() as m:
            m.setattr(cycles, "REACH_LIMIT", 0)
            bounded = fusion.Planner(graph, cfg)
            bounded.buffered |= planner.buffered
            for a in nodes:
                for b in nodes:
                    assert bounded._depends(a, {b}, False) == full._depends(a, {b}, False), (a, b)
    assert answers[True] > 20 and answers[False] > 20
