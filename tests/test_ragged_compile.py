"""Ragged code compiled: searchsorted row ids, advanced-indexing gathers of the dense partner, the
ragged GIoU loss as one kernel with no recompiles as the box counts change, and its gradients."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import ragged
from ember.workloads.giou import make_batch, padded_giou_loss, ragged_giou_loss

from .helpers import assert_clean, assert_same, check, compile_checked, kernel_count, on_the_interpreter

# ---- advanced indexing ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool])
def test_two_index_gather_fuses_into_its_consumer(dtype):
    x = torch.randn(6, 7, 3).to(dtype)
    rows = torch.tensor([0, 5, 5, 2, -1, 3])       # a negative index counts from the end
    cols = torch.tensor([6, 0, -7, 3, 2, 1])

    def fn(x, rows, cols):
        return (x[rows, cols] * 2).to(torch.float32).sum(-1)

    report = check(fn, x, rows, cols)
    assert report.fallbacks == []
    assert kernel_count(report) == 1


@pytest.mark.parametrize("case", ["broadcast", "skip_first_dim", "one_index", "int32", "empty", "strided"])
def test_index_shapes_like_eager(case):
    x = torch.randn(5, 6, 4)
    i = torch.tensor([[0, 4], [2, 1]])
    if case == "broadcast":
        args, fn = (x, i, torch.tensor([3, 5])), lambda x, i, j: x[i, j] + 1
    elif case == "skip_first_dim":
        args, fn = (x, i), lambda x, i: x[:, i] * 3
    elif case == "one_index":
        args, fn = (x, torch.tensor([4, 0, 0])), lambda x, i: x[i].sum(0)
    elif case == "int32":
        args, fn = (x, i.int(), i.int()), lambda x, i, j: x[i, j] - 1
    elif case == "empty":
        args, fn = (x, torch.zeros(0, dtype=torch.long)), lambda x, i: x[i] * 2
    else:  # a transposed input: the gather reads through its strides
        args, fn = (x.transpose(0, 1), torch.tensor([1, 5])), lambda x, i: x[i] + 0.5
    report = check(fn, *args)
    assert report.fallbacks == []


def test_index_select_fuses():
    x, idx = torch.randn(8, 5), torch.tensor([7, 0, 3, 3])
    report = check(lambda x, i: x.index_select(0, i) * 2, x, idx)
    assert report.fallbacks == []
    with pytest.raises(IndexError):
        ember.compile(lambda x, i: x.index_select(0, i) * 2)(x, torch.tensor([8]))


def test_out_of_range_index_raises_index_error_like_eager():
    x = torch.randn(4, 5)
    bad = torch.tensor([1, 4])
    with pytest.raises(IndexError):
        x[bad]
    fast = ember.compile(lambda x, i: x[i] * 2)
    with pytest.raises(IndexError, match="index"):
        fast(x, bad)
    with pytest.raises(IndexError):
        fast(x, torch.tensor([-5]))
    assert_same(fast(x, torch.tensor([-4, 3])), x[torch.tensor([-4, 3])] * 2)  # still usable


def test_boolean_mask_index_runs_through_aten():
    x = torch.randn(6)
    out = ember.compile(lambda x: x[x > 0] * 2)(x)
    assert_same(out, x[x > 0] * 2)


# ---- searchsorted / bucketize ----------------------------------------------------------------

@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
def test_searchsorted_matches_eager(right, dtype):
    seq = torch.tensor([0, 0, 2, 2, 2, 5, 9, 9, 12]).to(dtype)
    sorted_queries = torch.arange(-1, 14).to(dtype)
    random_queries = torch.randint(-3, 15, (40,)).to(dtype)  # unsorted: the hint must not matter

    def fn(seq, a, b):
        return (torch.searchsorted(seq, a, right=right), torch.searchsorted(seq, b, right=right) * 2,
                torch.searchsorted(seq, a, right=right, out_int32=True))

    report = check(fn, seq, sorted_queries, random_queries)
    assert report.fallbacks == []


def test_searchsorted_edge_sequences():
    for seq in [torch.zeros(0, dtype=torch.long), torch.tensor([3]), torch.arange(1000) * 2]:
        q = torch.randint(-2, 2010, (300,)).sort().values
        check(lambda s, q: torch.searchsorted(s, q) + torch.searchsorted(s, q, right=True), seq, q)


def test_bucketize_matches_eager():
    boundaries = torch.tensor([0.5, 1.0, 2.5])
    x = torch.tensor([[0.0, 0.5, 0.7], [1.0, 3.0, -1.0]])
    check(lambda x, b: torch.bucketize(x, b) + torch.bucketize(x, b, right=True), x, boundaries)


@pytest.mark.parametrize("fn, args", [
    (lambda s, q: torch.searchsorted(s * 2, q), (torch.tensor([1.0, 2, 3, 4]), torch.tensor([0.5, 2.5, 5, 1]))),
    (lambda q: torch.bucketize(q, torch.arange(6)), (torch.tensor([0, 3, 7, -1]),)),
    (lambda q: torch.bucketize(q, torch.linspace(0, 1, 8)), (torch.rand(8),)),
], ids=["computed_same_shape", "arange", "linspace"])
def test_searches_in_sequences_the_graph_computes(fn, args):
    # a sequence computed over the queries' shape was planned into the search's own kernel, and
    # an arange (recomputed from the index wherever it is read) was never stored: planning was
    # stuck and the whole graph ran through ATen with a warning
    report = check(fn, *args)
    assert report.fallbacks == [] and len(report.kernels) == 2


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
def test_searches_of_nan_sort_it_last_as_eager(options):
    # eager compares !(x >= v): a NaN query lands after every bound (left searches gave 0)
    inf, nan = float("inf"), float("nan")
    queries = torch.tensor([0.25, nan, 2.0, -inf, inf, 1.0, nan])
    bounds = torch.tensor([-1.0, 0.0, 0.5, 1.0])
    report = check(lambda b, q: torch.stack([torch.searchsorted(b, q), torch.searchsorted(b, q, right=True),
                                             torch.bucketize(q, b)]), bounds, queries, options=options)
    assert report.fallbacks == []


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
def test_searches_in_bounds_sorted_with_nan_probe_as_eager(options):
    # torch.sort puts NaN last; past the bounds below v, eager's !(x >= v) passes a NaN bound too,
    # so the answer depends on which bounds the search reads: ember's search read others (v = 1
    # in [-inf, -1, 0, 0, 2, nan] gave 4, eager 6), and a hint from the previous query others again
    inf, nan = float("inf"), float("nan")
    queries = torch.tensor([-inf, -2.0, -0.0, 0.0, 1.0, 2.0, 3.0, inf, nan, 0.5, -1.0])
    bounds = [torch.tensor([-inf, -1.0, 0.0, 0.0, 2.0, nan]), torch.tensor([0.0, 1.0, 2.0, nan, nan]),
              torch.tensor([nan, nan]), torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 4.0, nan])]
    for b in bounds:
        report = check(lambda b, q: torch.stack([torch.searchsorted(b, q), torch.searchsorted(b, q, right=True),
                                                 torch.searchsorted(b, q.sort().values)]), b, queries, options=options)
        assert report.fallbacks == ["aten.sort"]


@pytest.mark.parametrize("options", [None, pytest.param({"target": "triton"}, marks=on_the_interpreter)])
def test_batched_searches_are_generated(options):
    # a search per row (top-p sampling in each row's cumulative probabilities; a 3-d batch; a
    # transposed one) ran through ATen: only 1-d sequences were generated
    def sample(logits, u):
        return torch.searchsorted(logits.softmax(-1).cumsum(-1), u, right=True)

    compiled, report = compile_checked(sample, dynamic=True, options=options)
    for rows in (6, 3, 9):
        logits, u = torch.randn(rows, 9), torch.rand(rows, 2)
        assert_same(compiled(logits, u), sample(logits, u))
    assert_clean(report)
    assert report.fallbacks == [] and len(report.graphs) == 1  # (no recompile)
    bounds = torch.rand(2, 3, 7).sort().values
    bounds[1, 2, 5:] = float("nan")
    report = check(lambda b, q: (torch.searchsorted(b, q), torch.searchsorted(b.transpose(0, 1), q.transpose(0, 1),
                                                                             out_int32=True)),
                   bounds, torch.rand(2, 3, 5), options=options)
    assert report.fallbacks == []


# ---- ragged programs -------------------------------------------------------------------------

def _ragged_batch(batch: int, seed: int, offsets_dtype=torch.int64):
    pred, targets, padded = make_batch(batch, seed=seed)
    return pred, ragged.from_list(targets, offsets_dtype=offsets_dtype), padded


def test_row_ids_and_positions_compile_to_one_kernel():
    r = ragged.from_list([torch.randn(n, 2) for n in [3, 0, 1, 0, 0, 4]])

    def fn(rr):
        return rr.row_ids(), rr.positions()

    report = check(fn, r)
    assert report.fallbacks == []
    assert kernel_count(report) == 1
    ids, pos = fn(r)
    assert ids.tolist() == [0, 0, 0, 2, 5, 5, 5, 5] and pos.tolist() == [0, 1, 2, 0, 0, 1, 2, 3]


@pytest.mark.parametrize("offsets_dtype", [torch.int64, torch.int32])
def test_ragged_giou_loss_is_one_kernel_without_recompiles(offsets_dtype):
    report = ember.Report()
    fast = ember.compile(ragged_giou_loss, report=report)
    for seed in range(6):  # a different number of boxes per image every batch
        pred, targets, padded = _ragged_batch(32, seed, offsets_dtype)
        out = fast(pred, targets)
        assert_same(out, ragged_giou_loss(pred, targets))
        torch.testing.assert_close(out, padded_giou_loss(pred, padded), rtol=1e-5, atol=1e-6)
    assert len(report.graphs) == 1, "the box count is symbolic from the first call"
    assert report.fallbacks == []
    assert kernel_count(report) == 1
    assert "ember_search" in report.kernels[0].source


def test_batch_sizes_that_change_compile_once():
    """A token-budget sampler (or an epoch's last batch) changes B every batch: a Ragged's
    offsets are dynamic from the first call, so functions of ragged inputs compile once, and a
    dense partner of the boxes recompiles once (then both sizes are symbolic) and its gradient
    stays one gather kernel."""
    def pooled(r):
        return ragged.segment_mean(r).sum(1), ragged.segment_max(r), (r.values * r.values.sum()).sum()

    report = ember.Report()
    fast = ember.compile(pooled, report=report)
    for batch in (5, 9, 2, 17, 3):  # (B + 1 and T above 1: Dynamo specializes sizes 0 and 1)
        r = ragged.from_list([torch.randn(n % 4, 3) for n in range(1, batch + 1)])
        assert_same(fast(r), pooled(r))
    assert len(report.graphs) == 1 and report.fallbacks == []

    report = ember.Report()
    step = ember.compile(ragged_giou_loss, report=report)
    for batch in (24, 32, 7, 48):
        pred, targets, _ = _ragged_batch(batch, batch)
        mine, ref = pred.clone().requires_grad_(), pred.clone().requires_grad_()
        loss = step(mine, targets)
        loss.backward()
        want = ragged_giou_loss(ref, targets)
        want.backward()
        assert_same([loss, mine.grad], [want, ref.grad])
    assert [g.kind for g in report.graphs].count("forward") == 2  # (pred's B: static, then symbolic)
    assert report.fallbacks == []
    backward = [g for g in report.graphs if g.kind == "backward"][-1]
    assert len(backward.kernels) == 1 and "zero_()" not in backward.wrapper


def test_from_padded_with_lengths_that_change():
    """Lengths given as a list make sizes Dynamo writes with its own Max (Max(3, s21, s81)),
    which had no Python spelling: the graph ran through ATen."""
    def packed_sum(padded, lengths):
        return ragged.from_padded(padded, lengths).values.sum(0)

    padded = torch.randn(3, 5, 2)
    report = ember.Report()
    fast = ember.compile(packed_sum, report=report)
    for lengths in ([3, 1, 5], [2, 2, 2], [5, 0, 4]):
        assert_same(fast(padded, lengths), packed_sum(padded, lengths))
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]


def test_ragged_giou_loss_gradient_matches_eager():
    pred, targets, _ = _ragged_batch(48, 3)
    fast = ember.compile(ragged_giou_loss)
    for seed in (3, 4):
        pred, targets, _ = _ragged_batch(48, seed)
        mine, ref = pred.clone().requires_grad_(), pred.clone().requires_grad_()
        fast(mine, targets).backward()
        ragged_giou_loss(ref, targets).backward()
        torch.testing.assert_close(mine.grad, ref.grad, rtol=1e-5, atol=1e-7)


def test_saved_column_views_keep_eager_strides_for_backward():
    """A forward output that eager gives as a strided view (a column of a fresh matrix) is
    saved for backward; the backward graph was traced with those strides."""
    def fn(x, i):
        y = x[i]  # a fresh (n, 4) tensor; its columns are saved by the partition
        a, b, c, d = y.unbind(-1)
        return (torch.maximum(a, c) * torch.minimum(b, d)).sum()

    x, i = torch.randn(10, 4), torch.tensor([3, 1, 1, 9, 0])
    mine, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    ember.compile(fn)(mine, i).backward()
    fn(ref, i).backward()
    torch.testing.assert_close(mine.grad, ref.grad)



@pytest.mark.parametrize("write, good, bad", [
    (lambda r, v: torch.zeros(r.batch_size, 6).index_put((r.row_ids(), r.positions()), v), (9,), [(4,), (20,)]),
    (lambda r, v: torch.ones(r.batch_size, 3).index_put((r.row_ids(),), v, accumulate=True), (9, 3),
     [(4, 3), (20, 3)]),
], ids=["put", "accumulate"])
def test_values_that_do_not_fit_the_rows_raise_as_in_eager(write, good, bad):
    # T is symbolic, and the trace does not check a value's size against it: the kernel read
    # past a 4-row value for T = 9 rows (garbage), or used 9 rows of 20
    r = ragged.from_list([torch.randn(3), torch.randn(0), torch.randn(4), torch.randn(2)])
    fast = ember.compile(write)
    v = torch.randn(good)
    assert_same(fast(r, v), write(r, v))
    for shape in bad:
        v = torch.randn(shape)
        with pytest.raises(RuntimeError, match="shape mismatch"):
            write(r, v)
        with pytest.raises(RuntimeError, match="shape mismatch"):
            fast(r, v)


def test_a_per_row_lookup_next_to_a_segment_sum_checks_empty_rows():
    # eager looks up table[cls] for every row; the segment kernel checked lookups only for rows
    # with elements (right for lookups the elements make), so row 1's 99 read table[0]
    def f(r, cls, table):
        return ragged.segment_sum(r) + table[cls]

    r = ragged.from_list([torch.ones(3, 2), torch.ones(0, 2), torch.ones(4, 2)])
    table = torch.arange(10.).view(5, 2)
    fast = ember.compile(f)
    assert_same(fast(r, torch.tensor([1, 4, 0]), table), f(r, torch.tensor([1, 4, 0]), table))
    with pytest.raises(IndexError):
        f(r, torch.tensor([1, 99, 0]), table)
    with pytest.raises(IndexError, match="out of bounds"):
        fast(r, torch.tensor([1, 99, 0]), table)


def test_gradients_through_a_nested_tensor():
    # the offsets came back from the forward as a detached copy, which the backward handed back
    # as the gradient's offsets: torch gave it another nested size (j3 for j2) and raised
    def f(n):
        return ragged.Ragged.from_nested(n).values * 2

    vals = torch.randn(7, 3, requires_grad=True)
    n = torch.nested.nested_tensor_from_jagged(vals, torch.tensor([0, 2, 7]))
    ember.compile(f)(n).sum().backward()
    assert_same(vals.grad, torch.full((7, 3), 2.0))


def test_a_backward_binds_the_batch_size_from_the_offsets():
    # the backward's only tensor of B rows had been the offsets, of B + 1: "cannot bind size
    # symbol(s)", and the backward ran through ATen
    def loss(r, tgt):
        h = torch.exp(r.values)
        return ((ragged.segment_sum(ragged.Ragged(h, r.offsets, r.max_length, validate=False)) - tgt) ** 2).mean()

    fast = ember.compile(loss, dynamic=True)
    before = ember.stats()["graph_fallbacks"]
    for lengths in ([5, 3, 2], [4, 1, 3, 2]):
        r = ragged.from_list([torch.randn(n, 4) for n in lengths])
        tgt = torch.randn(len(lengths), 4)
        mine = ragged.Ragged(r.values.clone().requires_grad_(), r.offsets)
        ref = ragged.Ragged(r.values.clone().requires_grad_(), r.offsets)
        fast(mine, tgt).backward()
        loss(ref, tgt).backward()
        assert_same(mine.values.grad, ref.values.grad)
    assert ember.stats()["graph_fallbacks"] == before


def test_a_ragged_built_inside_compiled_code_does_not_recompile_per_longest_row():
    # re-wrapping per-token scores with the batch's offsets: the constructor's checks of
    # max_length pinned it with a guard, and every batch with another longest row compiled
    # again (until Dynamo's limit, then ran eagerly)
    def attention_pool(r, w):
        p = ragged.jagged_softmax(ragged.Ragged(r.values @ w, r.offsets, r.max_length, validate=False))
        return ragged.segment_sum(ragged.Ragged(p.values * r.values, r.offsets, r.max_length, validate=False))

    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = ember.compile(attention_pool)
    w = torch.randn(8, 1)
    for longest in range(3, 10):
        r = ragged.from_list([torch.randn(2, 8), torch.randn(longest, 8)])
        assert_same(compiled(r, w), attention_pool(r, w))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before <= 2


@pytest.mark.parametrize("max_length", [3.0, "4", True])
def test_a_ragged_built_inside_compiled_code_checks_max_length_type(max_length):
    # (eager raised TypeError; inside compiled code any max_length was kept, and only a later
    # to_padded failed, with torch's own error)
    def rewrap(r):
        return ragged.Ragged(r.values * 2, r.offsets, max_length, validate=False)

    r = ragged.from_list([torch.randn(2, 3), torch.randn(4, 3)])
    with pytest.raises(TypeError, match="max_length must be an int or None"):
        rewrap(r)
    torch._dynamo.reset()
    with pytest.raises(TypeError, match="max_length must be an int or None"):
        ember.compile(rewrap)(r)


def test_a_ragged_built_inside_compiled_code_rejects_a_negative_max_length():
    # eager raised ValueError; inside compiled code a negative max_length was kept, and a later
    # to_padded built a padded tensor of negative width or failed with torch's own error
    def rewrap(r, n):
        return ragged.Ragged(r.values * 2, r.offsets, n, validate=False).max_length

    r = ragged.from_list([torch.randn(2, 3), torch.randn(4, 3)])
    with pytest.raises(ValueError, match="max_length must be >= 0, got -1"):
        rewrap(r, -1)
    torch._dynamo.reset()
    with pytest.raises(ValueError, match="max_length must be >= 0, got -1"):
        ember.compile(rewrap)(r, -1)
    torch._dynamo.reset()
    compiled = ember.compile(rewrap)
    for n in (5, 6, 7):  # the length turns symbolic; its sign check must not pin it
        assert compiled(r, n) == n
    with pytest.raises(ValueError, match="max_length must be >= 0, got -3"):
        compiled(r, -3)


def test_a_jagged_softmax_of_a_ragged_without_max_length_is_one_graph():
    # jagged_softmax read max_length only to hand it to its result; for a Ragged built in
    # compiled code without one, that read (a host sync) broke the graph into three
    def f(r, w):
        return ragged.jagged_softmax(ragged.Ragged(r.values * w, r.offsets, validate=False)).values

    r = ragged.from_list([torch.randn(3, 2), torch.randn(0, 2), torch.randn(5, 2)])
    w = torch.randn(2)
    assert torch._dynamo.explain(f)(r, w).graph_break_count == 0
    assert_same(f(r, w), torch.cat([row.softmax(0) for row in (r.values * w).split([3, 0, 5])]))
