"""Segment reductions (``torch.ops.ember.segment_reduce``, behind ember.ragged's segment_sum /
mean / max and jagged_softmax) compile to segment kernels: each row of the packed values is one
outer iteration that reads its extent from the offsets, with no atomics and no row ids."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import ragged
from ember.ragged import Ragged
from ember.ragged.ops import row_ids

from .helpers import assert_same, check, compile_checked, kernel_count

LENGTHS = [[3, 0, 5, 1], [0, 0, 0], [7, 1], [0, 40, 3, 0, 2]]
FEATURES = [(), (4,), (2, 3)]


def make(lengths, feature=(4,), dtype=torch.float32, offsets_dtype=torch.int64, seed=0) -> Ragged:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        rows = [(torch.randn((n, *feature), generator=gen) * 3).to(dtype) for n in lengths]
    else:
        rows = [torch.randint(-50, 50, (n, *feature), generator=gen, dtype=dtype) for n in lengths]
    return ragged.from_list(rows, feature_shape=feature, dtype=dtype, offsets_dtype=offsets_dtype)


def _sources(report: ember.Report) -> str:
    return "\n".join(k.source for k in report.kernels)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("fn", [ragged.segment_sum, ragged.segment_mean, ragged.segment_max],
                         ids=["sum", "mean", "max"])
def test_segment_reductions_are_one_kernel_without_atomics(lengths, feature, fn):
    r = make(lengths, feature)
    report = check(fn, r)
    assert report.fallbacks == []
    assert kernel_count(report) == 1
    source = _sources(report)
    assert "ember_seglen" in source and "atomic" not in source


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64])
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
def test_segment_reductions_over_dtypes(dtype, offsets_dtype):
    r = make([4, 0, 9, 2], (3,), dtype, offsets_dtype)
    fns = [ragged.segment_sum, ragged.segment_max] + ([ragged.segment_mean] if dtype.is_floating_point else [])
    for fn in fns:
        report = check(fn, r)
        assert report.fallbacks == [] and "ember_seglen" in _sources(report)


def test_amin_and_the_identity_of_empty_rows():
    r = make([2, 0, 3], (2,))

    def fn(values, offsets):
        return (torch.ops.ember.segment_reduce(values, offsets, "amin"),
                torch.ops.ember.segment_reduce(values, offsets, "amax"))

    report = check(fn, r.values, r.offsets)
    assert report.fallbacks == []
    low, high = ember.compile(fn)(r.values, r.offsets)
    assert torch.isinf(low[1]).all() and (low[1] > 0).all() and (high[1] < 0).all()


def test_a_batch_of_one_row_is_a_plain_reduction():
    """B = 1 (a size Dynamo specializes) went to ATen's scatter; its one row is every packed
    row, so it is a reduction over dim 0: with ties, empty (the identity), with NaN."""
    r = make([6], (3,))
    r.values.data[4] = r.values.data[1]  # ties: the max's gradient is split between them
    amin = lambda r: torch.ops.ember.segment_reduce(r.values, r.offsets, "amin")  # noqa: E731
    nan = Ragged(torch.tensor([1.0, float("nan"), 2.0]), torch.tensor([0, 3]))
    for fn, arg in [(ragged.segment_mean, r), (ragged.segment_max, make([0], (3,))), (amin, nan)]:
        assert check(fn, arg).fallbacks == []
    leaf, ref_leaf = r.values.clone().requires_grad_(), r.values.clone().requires_grad_()
    fn, report = compile_checked(ragged.segment_max)
    fn(Ragged(leaf, r.offsets)).sum().backward()
    ragged.segment_max(Ragged(ref_leaf, r.offsets)).sum().backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    assert report.fallbacks == []


def test_non_contiguous_values():
    base = torch.randn(4, 12)
    offsets = torch.tensor([0, 3, 3, 12])

    def fn(x, offsets):
        return torch.ops.ember.segment_reduce(x.t() * 2, offsets, "sum")  # (12, 4), strided

    report = check(fn, base, offsets)
    assert report.fallbacks == []


def test_one_compile_serves_every_batch():
    fn, report = compile_checked(ragged.segment_mean, dynamic=True)
    before = ember.stats()["graphs_compiled"]
    for i, lengths in enumerate([[3, 0, 5, 1], [2, 9], [1, 1, 1, 1, 1, 1, 1], [0, 4]]):
        r = make(lengths, (5,), seed=i)
        assert_same(fn(r), ragged.segment_mean(r))
    assert ember.stats()["graphs_compiled"] - before <= 2  # the first (static) call, then one dynamic


@pytest.mark.parametrize("fn", [ragged.segment_sum, ragged.segment_mean, ragged.segment_max],
                         ids=["sum", "mean", "max"])
def test_gradients_match_eager(fn):
    r = make([3, 0, 5, 2], (4,), torch.float64)
    # ties: the max's gradient is split evenly between them, as eager's amax; a NaN max: NaN
    # gradients in its row, as amax's
    r.values.data[1] = r.values.data[0]
    r.values.data[4, 2] = float("nan")
    leaf = r.values.clone().requires_grad_()
    ref_leaf = r.values.clone().requires_grad_()
    grad = torch.randn(4, 4, dtype=torch.float64)
    fn(Ragged(ref_leaf, r.offsets, r.max_length)).backward(grad)
    ember.compile(fn)(Ragged(leaf, r.offsets, r.max_length)).backward(grad)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, equal_nan=True)


def test_jagged_softmax_matches_eager_with_segment_kernels():
    r = make([3, 0, 5, 1, 12], ())
    report = check(lambda r: ragged.jagged_softmax(r).values, r)
    assert report.fallbacks == []
    assert "ember_seglen" in _sources(report) and "atomic" not in _sources(report)


def test_bad_arguments_raise_eager_errors():
    values, offsets = torch.randn(5, 2), torch.tensor([0, 2, 5])
    with pytest.raises(ValueError, match="reduce must be one of"):
        ember.compile(lambda v, o: torch.ops.ember.segment_reduce(v, o, "mean"))(values, offsets)
    # (the message names its op once: ember's renaming of a traced op's error prefixed it again)
    with pytest.raises(ValueError, match="^segment_reduce: offsets must be a 1-d int32 or int64"):
        ember.compile(lambda v, o: torch.ops.ember.segment_reduce(v, o, "sum"))(values, offsets.float())


def test_sum_by_row_ids_is_a_segment_sum():
    # index_add by ragged row ids (the backward of gathering a per-row value) needs no atomics
    r = make([3, 0, 5, 1], (4,))

    def fn(values, offsets):
        rows = row_ids(offsets, values.shape[0])  # what Ragged.row_ids() runs
        base = torch.ones(offsets.shape[0] - 1, 4)
        return torch.zeros(offsets.shape[0] - 1, 4).index_add(0, rows, values * 2), base.index_add(0, rows, values)

    report = check(fn, r.values, r.offsets)
    assert report.fallbacks == []
    source = _sources(report)
    assert "atomic" not in source and "ember_seglen" in source


def test_training_is_one_kernel_each_way_and_gradients_match():
    r = make([3, 0, 5, 1, 7], ())
    leaf, ref_leaf = r.values.clone().requires_grad_(), r.values.clone().requires_grad_()
    grad = torch.randn(r.values.shape[0])
    report = ember.Report()
    fn = ember.compile(lambda r: ragged.jagged_softmax(r).values, report=report)
    fn(Ragged(leaf, r.offsets, r.max_length)).backward(grad)
    ragged.jagged_softmax(Ragged(ref_leaf, r.offsets, r.max_length)).values.backward(grad)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    for kind in ("forward", "backward"):
        graph = next(g for g in report.graphs if g.kind == kind)
        assert len(graph.kernels) == 1 and not graph.fallbacks, kind
    # row ids are recomputed in the backward (not saved), so the gradient of s[row_ids] is a
    # segment sum, not an atomic scatter
    backward = next(g for g in report.graphs if g.kind == "backward")
    assert "ember_seglen" in backward.kernels[0].source and "atomic" not in backward.kernels[0].source
    assert "searchsorted" not in backward.wrapper.split("\n")[1]  # not among the saved inputs


@pytest.mark.parametrize("feature", [(), (4,), (2, 3)])
@pytest.mark.parametrize("options", [None, {"target": "triton"}], ids=["cpp", "triton"])
def test_a_mean_gradient_walks_each_row_once(feature, options):
    """segment_mean's gradient broadcasts each row's value down its packed rows: one segment
    kernel over (B, *feature) that reads each row's start and length once and stores down the
    row, not a pointwise kernel over (T, *feature) searching the offsets for every element."""
    r = make([3, 0, 5, 1, 7], feature)
    leaf, ref_leaf = r.values.clone().requires_grad_(), r.values.clone().requires_grad_()
    grad = torch.randn(5, *feature)
    fn, report = compile_checked(ragged.segment_mean, options=options)
    fn(Ragged(leaf, r.offsets, r.max_length)).backward(grad)
    ragged.segment_mean(Ragged(ref_leaf, r.offsets, r.max_length)).backward(grad)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad)
    backward = next(g for g in report.graphs if g.kind == "backward")
    (kernel,) = backward.kernels
    assert "ember_seglen" in kernel.source and "search" not in kernel.source, kernel.source


@pytest.mark.parametrize("fn", [ragged.segment_sum, ragged.segment_mean, ragged.segment_max],
                         ids=["sum", "mean", "max"])
def test_long_rows_split_over_programs(fn):
    """A few long rows beside short ones, each row block's rows split over programs whose
    partials the last to finish combines (the launch a handful of long documents gets)."""
    r = make([300, 0, 1, 97, 64], (5,))
    split = {"XBLOCK": 8, "RBLOCK": 16, "num_warps": 4, "num_stages": 1, "PERSISTENT": False, "SPLIT": 4}
    compiled, report = compile_checked(fn, options={"target": "triton", "triton_launch": split})
    assert_same(compiled(r), fn(r))
    (kernel,) = report.kernels
    assert "NPROG_BLOCK > 1" in kernel.source and "ember_seglen" in kernel.source
