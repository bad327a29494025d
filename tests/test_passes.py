"""Each pass: an input graph, the pass, and the graph we expect (compared structurally)."""

from __future__ import annotations

import os

import pytest
import sympy
import torch

import ember
from ember.ir import GraphBuilder, Op, dtypes, structurally_equal, verify
from ember.passes import PIPELINE, cse, dce, fold_constants, run_pipeline, simplify_views
from ember.passes.fold import scalar_value
from ember.passes.onehot import one_hot_sums
from ember.passes.pipeline import PASS_NAMES
from ember.passes.scans import padded_scans

from .helpers import assert_clean, assert_same


def assert_pass(pass_fn, before, expected):
    verify(before)
    after = pass_fn(before)
    verify(after)
    assert structurally_equal(after, expected), f"got:\n{after}\n\nexpected:\n{expected}"
    return after


def test_dce_drops_unused_nodes():
    b = GraphBuilder()
    x = b.input((4,))
    b.exp(x)  # dead
    y = b.neg(x)
    before = b.build(y)
    after = assert_pass(dce, before, before)
    assert [n.op for n in after.nodes] == [Op.INPUT, Op.NEG]


def test_cse_merges_identical_nodes_and_commutative_operands():
    b = GraphBuilder()
    x, y = b.input((4,)), b.input((4,))
    s1, s2 = b.add(x, y), b.add(y, x)
    before = b.build(b.mul(b.exp(s1), b.exp(s2)))
    e = GraphBuilder()
    x, y = e.input((4,)), e.input((4,))
    t = e.exp(e.add(x, y))
    assert_pass(cse, before, e.build(e.mul(t, t)))


def test_cse_keeps_max_and_min_of_swapped_operands_apart():
    # eager's maximum keeps its first operand on a tie: maximum(-0.0, 0.0) is -0.0, the other 0.0
    b = GraphBuilder()
    x, y = b.input((4,)), b.input((4,))
    before = b.build(b.add(b.op(Op.MAX, x, y), b.op(Op.MAX, y, x)), b.add(b.op(Op.MIN, x, y), b.op(Op.MIN, y, x)))
    assert_pass(cse, before, before)
    a, z = torch.tensor([-0.0, 1.0]), torch.tensor([0.0, float("nan")])
    fn = lambda a, b: (1 / torch.maximum(a, b), 1 / torch.maximum(b, a), 1 / torch.minimum(b, a))  # noqa: E731
    for got, want in zip(ember.compile(fn)(a, z), fn(a, z)):
        assert torch.equal(got.nan_to_num(), want.nan_to_num()), (got, want)


def test_fold_keeps_symbolic_ints_wrapping_in_narrow_dtypes():
    # a Python int Dynamo made symbolic (n = 200) times an int8 tensor wraps in eager; a cast
    # of n into float16 rounds (2049 is 2048): both stay ops. In int64 they fold.
    n = sympy.Symbol("s0", integer=True, positive=True)
    b = GraphBuilder()
    x = b.input((3,), dtypes.int8)
    narrow = b.op(Op.MUL, b.cast(b.const(n, dtypes.int64), dtypes.int8), b.const(3, dtypes.int8))
    half = b.cast(b.const(n, dtypes.int64), dtypes.float16)
    wide = b.op(Op.MUL, b.const(n, dtypes.int64), b.const(n, dtypes.int64))
    before = b.build(b.op(Op.MAX, x, b.expand(narrow, (3,))), b.expand(half, (3,)), wide)
    after = dce(fold_constants(before))
    ops = [node.op for node in after.nodes]
    assert ops.count(Op.CAST) == 2 and ops.count(Op.MUL) == 1
    assert after.outputs[2].op is Op.CONST and after.outputs[2].arg == n**2
    wraps = lambda x, n: torch.maximum(torch.ones(3, dtype=torch.int8) * n, x)  # noqa: E731
    rounds = lambda x, n: x == n  # noqa: E731
    for fn, x, value in ((wraps, torch.zeros(3, dtype=torch.int8), 200),
                         (rounds, torch.tensor([2048.0, 1.0], dtype=torch.float16), 2049)):
        compiled = ember.compile(fn, dynamic=True)
        for v in (value, value + 2):
            assert torch.equal(compiled(x, v), fn(x, v))


def test_cse_keeps_distinct_constants_apart():
    b = GraphBuilder()
    x = b.input((2,))
    before = b.build(b.add(b.mul(x, b.full(0.0, (2,))), b.mul(x, b.full(-0.0, (2,)))))
    assert len(cse(before).nodes) == len(dce(before).nodes)


def test_fold_evaluates_constant_arithmetic_with_dtype_rounding():
    b = GraphBuilder()
    x = b.input((3,))
    c = b.add(b.full(0.1, (3,)), b.full(0.2, (3,)))  # in float32: 0.30000001192...
    before = b.build(b.mul(x, c))
    after = fold_constants(before)
    consts = [n.arg for n in dce(after).nodes if n.op is Op.CONST]
    assert consts == [0.30000001192092896]


def test_fold_computes_16_bit_constants_in_float32_and_rounds_once():
    # a float16 mean's backward, 1 / 65536: the literal rounded to float16 first was inf, and
    # every gradient 0; eager (and ember's kernels) divide in float32 and round the result
    b = GraphBuilder()
    x = b.input((3,), dtypes.float16)
    scale = b.div(b.full(1.0, (3,), dtypes.float16), b.full(65536, (3,), dtypes.float16))
    tenth = b.add(b.full(0.1, (3,), dtypes.bfloat16), b.full(0.0, (3,), dtypes.bfloat16))
    after = dce(fold_constants(b.build(b.mul(x, scale), tenth)))
    consts = [n.arg for n in after.nodes if n.op is Op.CONST]
    assert consts == [2.0 ** -16, 0.10009765625]  # 0.1 as bfloat16 holds it


def test_fold_removes_exact_identities_only():
    b = GraphBuilder()
    x = b.input((3,))
    one, zero, negzero = b.full(1.0, (3,)), b.full(0.0, (3,)), b.full(-0.0, (3,))
    kept = b.add(x, zero)               # x + 0.0 turns -0.0 into 0.0: not an identity
    gone = b.sub(b.add(b.mul(x, one), negzero), zero)
    before = b.build(kept, gone)
    e = GraphBuilder()
    x2 = e.input((3,))
    expected = e.build(e.add(x2, e.full(0.0, (3,))), x2)
    assert_pass(fold_constants, before, expected)


def test_fold_keeps_a_constant_where_whose_dropped_branch_can_raise():
    # eager computes both branches of where(False, x[i], y), so an index out of range raises
    # there; dropping the gather dropped its bounds check (and a zero divisor's)
    b = GraphBuilder()
    x, i = b.input((5,)), b.input((3,), dtypes.int64)
    a, d = b.input((3,), dtypes.int64), b.input((3,), dtypes.int64)
    false, true = b.full(False, (3,), dtypes.bool_), b.full(True, (3,), dtypes.bool_)
    head = b.slice(x, 0, 0, 1, 3)
    gathered = b.op(Op.GATHER, x, i, arg=0)
    both = b.where(false, gathered, b.exp(gathered))  # the kept branch gathers too
    dropped_gather = b.where(false, gathered, b.neg(head))
    dropped_division = b.where(true, b.add(a, d), b.op(Op.FLOORDIV, a, d))
    plain = b.where(true, b.neg(head), b.exp(head))
    after = dce(fold_constants(b.build(both, dropped_gather, dropped_division, plain)))
    assert [o.op for o in after.outputs] == [Op.EXP, Op.WHERE, Op.WHERE, Op.NEG]

    cases = [(lambda x, i: torch.where(torch.zeros(3, dtype=torch.bool), x[i], x[:3] + 1),
              torch.randn(5), torch.tensor([0, 7, 1]), torch.tensor([0, 4, 1])),
             (lambda x, i: torch.where(torch.tensor(False), torch.gather(x, 0, i), 2.0),
              torch.randn(5), torch.tensor([0, -1, 1]), torch.tensor([0, 2, 1])),
             (lambda a, d: torch.where(torch.ones(3, dtype=torch.bool), a + d, a // d),
              torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2]), torch.tensor([1, 3, 2]))]
    for fn, x, bad, good in cases:
        with pytest.raises((IndexError, RuntimeError)) as want:
            fn(x, bad)
        with pytest.raises(want.type):
            ember.compile(fn)(x, bad)
        assert_same(ember.compile(fn)(x, good), fn(x, good))


def test_fold_round_trip_casts():
    b = GraphBuilder()
    x = b.input((3,), dtypes.bfloat16)
    there_and_back = b.cast(b.cast(x, dtypes.float32), dtypes.bfloat16)
    lossy = b.cast(b.cast(b.input((3,), dtypes.float32), dtypes.bfloat16), dtypes.float32)
    before = b.build(there_and_back, lossy)
    after = fold_constants(before)
    assert after.outputs[0] is after.inputs[0]
    assert after.outputs[1].op is Op.CAST  # float32 -> bfloat16 rounds: must stay


def test_fold_symbolic_sizes_stay_symbolic():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    b = GraphBuilder()
    x = b.input((s0,), dtypes.int64)
    n = b.mul(b.const(s0, dtypes.int64), b.const(2, dtypes.int64))
    before = b.build(b.add(x, b.expand(n, (s0,))))
    after = dce(fold_constants(before))
    consts = [n.arg for n in after.nodes if n.op is Op.CONST]
    assert consts == [2 * s0]


def test_reduction_over_size_one_dims_is_identity():
    b = GraphBuilder()
    x = b.input((4, 1))
    before = b.build(b.amax(x, (1,)), b.argmax(x, (1,)), b.sum(x, (1,)))
    after = dce(fold_constants(before))
    assert after.outputs[0] is after.inputs[0]
    assert after.outputs[1].op is Op.EXPAND and after.outputs[1].inputs[0].arg == 0
    # eager's sum starts from 0.0: a lone -0.0 sums to 0.0, so a float sum is x + 0.0
    total = after.outputs[2]
    assert total.op is Op.ADD and total.inputs[0] is after.inputs[0] and scalar_value(total.inputs[1]) == 0.0


def test_view_chains_collapse():
    b = GraphBuilder()
    x = b.input((2, 3, 4))
    r = b.reshape(b.reshape(x, (6, 4)), (24,))
    p = b.permute(b.permute(x, (1, 2, 0)), (2, 0, 1))   # back to identity
    e = b.expand(b.expand(b.reshape(x, (2, 3, 4, 1)), (2, 3, 4, 5)), (2, 3, 4, 5))
    before = b.build(r, p, e)
    g = GraphBuilder()
    x2 = g.input((2, 3, 4))
    expected = g.build(g.reshape(x2, (24,)), x2, g.expand(g.reshape(x2, (2, 3, 4, 1)), (2, 3, 4, 5)))
    assert_pass(simplify_views, before, expected)


def test_views_of_constants_become_broadcast_constants():
    b = GraphBuilder()
    x = b.input((6, 4))
    c = b.permute(b.reshape(b.full(2.0, (4, 6)), (4, 6)), (1, 0))
    before = b.build(b.mul(x, c))
    g = GraphBuilder()
    x2 = g.input((6, 4))
    expected = g.build(g.mul(x2, g.full(2.0, (6, 4))))
    assert_pass(simplify_views, before, expected)


def test_pipeline_is_a_flat_named_list_and_records_each_pass():
    names = [name for name, _ in PIPELINE]
    assert names[0] == "dce" and "cse" in names and "fold_constants" in names and "simplify_views" in names
    b = GraphBuilder()
    x = b.input((4,))
    g = b.build(b.add(b.mul(x, b.full(1.0, (4,))), b.full(-0.0, (4,))))
    record = []
    out = run_pipeline(g, record=record)
    assert [r.name for r in record] == ["frontend"] + names
    assert out.outputs[0] is out.inputs[0]
    assert "graph" in record[-1].ir


def _one_hot_rows(b, values, k, n=6, start=0):
    """where(iota == k, values, 0) over rows of n, iota along dim 1."""
    pos = b.expand(b.reshape(b.op(Op.IOTA, arg=(n, start, 1), dtype=dtypes.int64), (1, n)), (4, n))
    return b.where(b.eq(pos, b.expand(k, (4, n))), values, b.full(0.0, (4, n)))


def test_one_hot_sums_become_a_select_per_row():
    b = GraphBuilder()
    k, s = b.input((4, 1), dtypes.int64), b.input((4, 1))
    before = b.build(b.reduce(Op.SUM, _one_hot_rows(b, b.expand(s, (4, 6)), k), [1]))
    e = GraphBuilder()
    k, s = e.input((4, 1), dtypes.int64), e.input((4, 1))
    valid = e.op(Op.AND, e.ge(k, e.full(0, (4, 1), dtypes.int64)), e.lt(k, e.full(6, (4, 1), dtypes.int64)))
    zero = e.full(0.0, (4, 1))
    # one term s and five zeros where 0 <= k < 6, else six zeros (x + 0.0 stays: -0.0 + 0.0 is 0.0)
    expected = e.build(e.where(valid, e.add(s, zero), zero))
    assert_pass(lambda g: dce(cse(simplify_views(one_hot_sums(g)))), before, expected)


@pytest.mark.parametrize("dynamic", [False, True])
def test_one_hot_sums_over_no_positions_are_zero(dynamic):
    # n * F(false) for n = 0 was 0 * inf = NaN where eager sums nothing to 0
    def fn(b, k, n):
        return torch.where(torch.arange(n.shape[0]) == k[:, None], 1.0, b).sum(-1)

    b, k = torch.tensor([[float("inf")], [float("nan")], [2.0]]), torch.tensor([0, 1, 5])
    compiled = ember.compile(fn, dynamic=dynamic)
    for n in (0, 3, 7):
        torch.testing.assert_close(compiled(b, k, torch.empty(n)), fn(b, k, torch.empty(n)), equal_nan=True)


@pytest.mark.parametrize("dtype,n", [(torch.uint8, 256), (torch.int8, 128), (torch.int16, 300)])
def test_one_hot_sums_over_a_narrow_iota(dtype, n):
    # 0 <= k < n was built in k's dtype: 256 as a uint8 is 0, so no byte token ever matched
    def fn(tokens):
        return (torch.arange(n, dtype=dtype) == tokens[:, None]).float().sum(-1)

    tokens = torch.tensor([0, 5, n - 1, -1 if dtype.is_signed else 7], dtype=dtype)
    torch.testing.assert_close(ember.compile(fn)(tokens), fn(tokens))


def test_one_hot_sums_of_negative_zeros_are_zero():
    # t + (N - 1) * f was -0.0 for terms all -0.0, where eager's sum starts from 0.0
    def fn(k, x, n):
        return ((torch.arange(n.shape[0]) == k[:, None]).float() * x[:, None]).sum(1)

    k, x = torch.tensor([1, -1, 9, 3]), torch.tensor([-0.0, -0.0, -0.0, 2.0])
    for dynamic in (False, True):
        out, ref = ember.compile(fn, dynamic=dynamic)(k, x, torch.empty(8)), fn(k, x, torch.empty(8))
        assert torch.equal(out, ref) and torch.equal(out.signbit(), ref.signbit()), (out, ref)


def test_one_hot_sums_leave_other_sums_alone():
    for variant in ("varies", "two positions", "iota from 1", "integer"):
        b = GraphBuilder()
        k, k2, s, x = (b.input((4, 1), dtypes.int64), b.input((4, 1), dtypes.int64), b.input((4, 1)),
                       b.input((4, 6)))
        if variant == "varies":  # the kept value is not the same along the row
            v = _one_hot_rows(b, x, k)
        elif variant == "two positions":
            v = b.add(_one_hot_rows(b, b.expand(s, (4, 6)), k), _one_hot_rows(b, b.expand(s, (4, 6)), k2))
        elif variant == "iota from 1":
            v = _one_hot_rows(b, b.expand(s, (4, 6)), k, start=1)
        else:
            v = b.cast(_one_hot_rows(b, b.expand(s, (4, 6)), k), dtypes.int64)
        before = dce(b.build(b.reduce(Op.SUM, v, [1])))
        assert structurally_equal(one_hot_sums(before), before), variant


def test_a_scan_after_its_neutral_becomes_the_scan_of_the_padded_input():
    # offsets from lengths: cat([0], cumsum(L)) is cumsum(cat([0], L)); a reversed scan's neutral
    # goes after it; any other value, or a cast between, stays a cat of a scan
    from ember.ir.node import ScanArg
    total, reverse = ScanArg("sum", 0, False), ScanArg("sum", 0, True)

    def graph(build, n=5):
        b = GraphBuilder()
        lengths = b.input((n,), dtypes.int64)
        zero = b.expand(b.const(0, dtypes.int64), (1,))
        return b.build(*build(b, lengths, zero))

    before = graph(lambda b, x, z: [b.op(Op.CAT, z, b.op(Op.SCAN, x, arg=total), arg=0),
                                    b.op(Op.CAT, b.op(Op.SCAN, x, arg=reverse), z, arg=0)])
    expected = graph(lambda b, x, z: [b.op(Op.SCAN, b.op(Op.CAT, z, x, arg=0), arg=total),
                                      b.op(Op.SCAN, b.op(Op.CAT, x, z, arg=0), arg=reverse)])
    assert_pass(padded_scans, before, expected)
    one = lambda b: b.expand(b.const(1, dtypes.int64), (1,))  # noqa: E731
    kept = graph(lambda b, x, z: [b.op(Op.CAT, b.op(Op.SCAN, x, arg=total), z, arg=0),
                                  b.op(Op.CAT, one(b), b.op(Op.SCAN, x, arg=total), arg=0)])
    assert_pass(padded_scans, kept, kept)


def _unit_reductions(x, i):
    """Reductions whose reduced dims all have size 1 (a batch of one), float and integer."""
    return (x.sum(0), 1 / x.sum(0), torch.log_softmax(x, 0), x.amax(0) + x.argmax(0), (x > 0).any(0),
            i.sum(0), x.mean((0, 2), keepdim=True))


@pytest.mark.parametrize("name", PASS_NAMES)
def test_any_pass_left_out_still_compiles_reductions_over_size_one_dims(name):
    # fold_constants removed these reductions, and without it the planner made a kernel with no
    # inner loop, which codegen could not render: the whole graph ran through ATen. A sum of a
    # lone -0.0 is 0.0, as eager's sum starts from 0 (1 / sum is inf, not -inf).
    x = torch.tensor([[-0.0, 1.5, -2.0]]).unsqueeze(-1)
    i = torch.tensor([[3, -4, 5]], dtype=torch.int32)
    options = {"target": "cpp", "passes_off": (name,), "skip_masked": name in ("mask_multiplies", "cse_masks")}
    report = ember.Report()
    got = ember.compile(_unit_reductions, options=options, report=report)(x, i)
    assert_clean(report)
    assert_same(got, _unit_reductions(x, i))
    if name == "fold_constants":  # the GPU backends too: CUDA C++ rendered (not built), Triton run
        assert not [g.error for g in ember.explain(_unit_reductions, x, i, target="cuda", options=options).graphs
                    if g.error]
        if os.environ.get("TRITON_INTERPRET") == "1":
            report = ember.Report()
            got = ember.compile(_unit_reductions, options={**options, "target": "triton"}, report=report)(x, i)
            assert_clean(report)
            assert_same(got, _unit_reductions(x, i))
