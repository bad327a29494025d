"""The IR: shape and dtype rules, the verifier, the printer, view index arithmetic."""

from __future__ import annotations

import pytest
import sympy

from ember.ir import Graph, GraphBuilder, IRError, Op, VerifyError, dtypes, make, verify
from ember.ir.node import Node
from ember.ir.strides import reshape_groups
from ember.schedule.indexing import _view_strides, map_reshape

s0 = sympy.Symbol("s0", integer=True, positive=True)


def test_shape_rules():
    b = GraphBuilder()
    x = b.input((s0, 4))
    assert b.sum(x, (1,)).shape == (s0, 1)
    assert b.argmax(x, (0,)).dtype == dtypes.int64
    assert b.lt(x, x).dtype == dtypes.bool_
    assert b.permute(x, (1, 0)).shape == (4, s0)
    assert b.slice(x, 1, 1, 2, 2).shape == (s0, 2)
    assert b.expand(b.const(1.0), (3, 5)).shape == (3, 5)
    with pytest.raises(IRError, match="differ"):
        b.add(x, b.input((4,)))
    with pytest.raises(IRError, match="dtypes"):
        b.add(x, b.input((s0, 4), dtypes.float64))
    with pytest.raises(IRError, match="element count"):
        make(Op.RESHAPE, (b.input((3, 4)),), (5, 4))
    with pytest.raises(IRError, match="permutation"):
        b.permute(x, (0, 0))


def test_verifier_catches_broken_graphs():
    b = GraphBuilder()
    x = b.input((4,))
    y = b.exp(x)
    good = b.build(y)
    verify(good)
    # a node whose recorded shape disagrees with its op's rule
    bad = Node(Op.EXP, (x,), None, dtypes.float32, (5,), "cpu")
    with pytest.raises(VerifyError, match="rule gives"):
        verify(Graph([x], [bad], [x, bad]), after="my_pass")
    # use before definition
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(Graph([x], [y], [y, x]))


def test_printer_reads_well():
    b = GraphBuilder("demo")
    x = b.input((s0, 8))
    w = b.input((8,))
    y = b.add(b.relu(x), b.expand(b.reshape(w, (1, 8)), (s0, 8)))
    text = str(b.build(y))
    assert text.splitlines()[0] == "graph demo(%arg0: f32[s0, 8], %arg1: f32[8]):"
    assert "maximum(%arg0, " in text and "expand(" in text
    assert text.splitlines()[-1].strip().startswith("return (%add_")


@pytest.mark.parametrize("out_shape,in_shape,groups", [
    ((6, 4), (2, 3, 4), [([0], [0, 1]), ([1], [2])]),
    ((2, 3, 4), (24,), [([0, 1, 2], [0])]),
    ((4, 1), (4,), [([0], [0]), ([1], [])]),
])
def test_reshape_groups(out_shape, in_shape, groups):
    assert reshape_groups(out_shape, in_shape) == groups


def test_reshape_point_mapping_round_trips():
    i, j = sympy.symbols("i j", integer=True, nonnegative=True)
    # (2, 3, 4) viewed as (6, 4): point (i, j) reads (i // 3, i % 3, j)
    point = map_reshape((i, j), (6, 4), (2, 3, 4))
    values = {(a, b): tuple(int(p.subs({i: a, j: b})) for p in point) for a in range(6) for b in range(4)}
    assert values[(4, 2)] == (1, 1, 2)
    assert len(set(values.values())) == 24


def test_view_strides_follow_atens_view_rule():
    # Whether a replayed chain of views copies is decided by ATen's rule for view(), run on
    # integer sizes: it must agree with torch on permuted, sliced and size-1 dims.
    import random

    import torch
    rng = random.Random(0)
    for _ in range(2000):
        t = torch.empty([rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 4))])
        order = list(range(t.dim()))
        rng.shuffle(order)
        t = t.permute(order)
        if rng.random() < 0.3 and t.shape[-1] > 1:
            t = t[..., ::2]
        rest, new = t.numel(), []
        for f in (2, 3, 2):
            if rest % f == 0 and rng.random() < 0.6:
                new.append(f)
                rest //= f
        new.append(rest)
        rng.shuffle(new)
        try:
            want = list(t.view(new).stride())
        except RuntimeError:
            want = None
        got = _view_strides(list(t.shape), list(t.stride()), new)
        assert (got is None) == (want is None), (t.shape, t.stride(), new)
        if want is not None:  # (a size-1 dim's stride is free)
            assert all(a == b or n == 1 for a, b, n in zip(got, want, new)), (t.shape, t.stride(), new)


def test_eager_saved_values_follow_their_nodes_through_passes():
    # (Graph.eager_saved: a backward's recomputed forward values, read rounded.) CSE merges the
    # recomputed product with its twin and dce drops a dead one: the set follows the survivor
    from ember.passes.cse import cse
    from ember.passes.dce import dce

    b = GraphBuilder()
    x = b.input((4,), dtypes.bfloat16)
    c = b.input((4,), dtypes.bfloat16)
    first, twin, dead = b.mul(x, c), b.mul(x, c), b.mul(c, c)
    g = b.build(b.exp(b.add(first, twin)))
    g = g.with_nodes(g.inputs, g.outputs, g.nodes, eager_saved=frozenset({twin, dead}))
    after = dce(cse(g))
    (product,) = [n for n in after.nodes if n.op is Op.MUL]
    assert after.eager_saved == {product}


def test_printer_marks_the_values_eager_saved():
    b = GraphBuilder()
    x = b.input((4,), dtypes.bfloat16)
    product = b.mul(x, x)
    g = b.build(b.exp(product))
    g = g.with_nodes(g.inputs, g.outputs, g.nodes, eager_saved=frozenset({product}))
    lines = str(g).splitlines()
    assert [line.split(":")[0].strip() for line in lines if line.endswith("# saved")] == ["%mul_1"]
