"""Writes of packed ragged rows at (row ids, positions) compiled as gathers over the dense tensor
(passes/ragged.py): the pass on hand-built graphs, and compiled writes and gradients against
eager over dtypes, offsets dtypes, empty rows and batches, and changing totals."""

from __future__ import annotations

import pytest
import sympy
import torch

import ember
from ember.analysis.reference import run_graph
from ember.ir import GraphBuilder, Op, structurally_equal, verify
from ember.ir import dtypes as dt
from ember.ir.node import ragged_totals, record_ragged_totals
from ember.passes import dce
from ember.passes.ragged import ragged_writes_as_gathers
from ember.ragged import Ragged

from .conftest import DEVICE
from .helpers import assert_clean, assert_same, check, compile_checked

B, N, F = 3, 4, 2
T = sympy.Symbol("s0", integer=True, positive=True)
TARGETS = [None, {"target": "triton"}] if DEVICE == "cpu" else [{"gpu_backend": "triton"}, {"gpu_backend": "cuda"}]
TARGET_IDS = ["cpp", "triton"] if DEVICE == "cpu" else ["triton", "cuda"]


def _write_graph(*, accumulate: bool = True, other_offsets: bool = False, batch: int = B):
    """dense (batch, N, F).index_put((row_ids, positions), values (T, F)), built by hand."""
    b = GraphBuilder()
    offsets = b.input((B + 1,), dt.int64)
    values = b.input((T, F))
    dense = b.input((batch, N, F))
    other = b.input((B + 1,), dt.int64)
    iota = b.op(Op.IOTA, arg=(T, 0, 1), dtype=dt.int64)
    rows = b.op(Op.SEARCH, b.slice(offsets, 0, 1, 1, B), iota, arg=(True, True))
    starts = b.slice(other if other_offsets else offsets, 0, 0, 1, B)
    positions = b.sub(iota, b.op(Op.INDEX, starts, rows, arg=0))
    put = b.op(Op.INDEX_PUT, dense, values, rows, positions, arg=(0, accumulate, 3))
    return b.build(put)


def _expected_gather(accumulate: bool):
    """The gather the pass should build: the formula of passes/ragged.py, written out."""
    b = GraphBuilder()
    offsets = b.input((B + 1,), dt.int64)
    values = b.input((T, F))
    dense = b.input((B, N, F))
    b.input((B + 1,), dt.int64)
    plane = (B, N)
    starts, ends = b.slice(offsets, 0, 0, 1, B), b.slice(offsets, 0, 1, 1, B)
    lengths = b.sub(ends, starts)
    checked = b.op(Op.INDEX, b.op(Op.IOTA, arg=(N + 1, 0, 1), dtype=dt.int64), lengths, arg=0)
    place = b.expand(b.reshape(b.op(Op.IOTA, arg=(N, 0, 1), dtype=dt.int64), (1, N)), plane)
    inside = b.lt(place, b.expand(b.reshape(checked, (B, 1)), plane))
    row = b.add(b.expand(b.reshape(starts, (B, 1)), plane), place)
    row = b.where(inside, row, b.full(T, plane, dt.int64))
    padded = b.op(Op.PAD, values, b.const(0.0), arg=((0, 1), (0, 0)))
    gathered = b.op(Op.INDEX, padded, row, arg=0)
    if accumulate:
        gathered = b.add(dense, gathered)
    cond = b.expand(b.reshape(inside, (B, N, 1)), (B, N, F))
    return b.build(b.where(cond, gathered, dense))


@pytest.mark.parametrize("accumulate", [True, False])
def test_a_write_at_row_ids_and_positions_becomes_a_gather(accumulate):
    before = _write_graph(accumulate=accumulate)
    verify(before)
    after = ragged_writes_as_gathers(before)
    verify(after)
    assert structurally_equal(after, _expected_gather(accumulate)), f"got:\n{after}"
    # and it computes what the write does, an empty row and a full one included
    offsets = torch.tensor([0, 2, 2, 6])
    values, dense = torch.randn(6, F), torch.randn(B, N, F)
    args = [offsets, values, dense, offsets]
    (want,) = run_graph(before, args, {T: 6})
    (got,) = run_graph(after, args, {T: 6})
    torch.testing.assert_close(got, want)
    rows = torch.tensor([0, 0, 2, 2, 2, 2])
    torch.testing.assert_close(got, dense.index_put((rows, torch.tensor([0, 1, 0, 1, 2, 3])), values,
                                                    accumulate=accumulate))


def test_the_total_stays_known_once_the_searches_are_gone():
    """T is offsets[-1] whether or not a row-ids search is left to show it: the frontend records
    the pairs (``Graph.totals``), and passes carry them, so kernels still read T on the device."""
    before = record_ragged_totals(_write_graph())
    after = dce(ragged_writes_as_gathers(before))
    assert not [n for n in after.nodes if n.op is Op.SEARCH]
    assert ragged_totals(after) == {T: after.inputs[0]} == ragged_totals(before)
    assert ragged_totals(dce(ragged_writes_as_gathers(_write_graph()))) == {}  # nothing recorded


def test_other_writes_stay_writes():
    graph = _write_graph(other_offsets=True)  # positions within other offsets' sequences
    assert structurally_equal(ragged_writes_as_gathers(graph), graph)


R = sympy.Symbol("s1", integer=True, positive=True)


@pytest.mark.parametrize("rows", [B + 2, B - 1, R], ids=["more rows", "fewer rows", "symbolic rows"])
def test_dense_rows_other_than_the_sequences_gather_too(rows):
    """R dense rows and B sequences need not be one size (a batch size that changes is another
    symbol): rows past B keep the dense values, and sequences past R raise if they have rows."""
    after = ragged_writes_as_gathers(_write_graph(batch=rows))
    verify(after)
    assert not [n for n in after.nodes if n.op is Op.INDEX_PUT]
    r = 2 if rows == R else int(rows)
    for offsets in ([0, 2, 2, 6], [0, 2, 6, 6], [0, 0, 0, 0]):
        offsets = torch.tensor(offsets)
        values, dense = torch.randn(int(offsets[-1]), F), torch.randn(r, N, F)
        rows_ids = torch.searchsorted(offsets[1:], torch.arange(len(values)), right=True)
        positions = torch.arange(len(values)) - offsets[rows_ids]
        try:
            want = dense.index_put((rows_ids, positions), values, accumulate=True)
        except IndexError:  # a sequence past the dense rows has rows
            with pytest.raises(IndexError):
                run_graph(after, [offsets, values, dense, offsets], {T: len(values), R: r})
            continue
        (got,) = run_graph(after, [offsets, values, dense, offsets], {T: len(values), R: r})
        torch.testing.assert_close(got, want)


def _ragged(lengths, feature=(F,), dtype=torch.float32, offsets_dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(sum(lengths), *feature, generator=g).to(dtype)
    offsets = torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=offsets_dtype)
    return Ragged(values.to(DEVICE), offsets.to(DEVICE))


def _pad(r: Ragged) -> torch.Tensor:
    return r.to_padded(-1.5, max_length=6)


def _accumulate(dense: torch.Tensor, r: Ragged) -> torch.Tensor:
    return dense.index_put((r.row_ids(), r.positions()), r.values * 2, accumulate=True)


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("offsets_dtype", [torch.int64, torch.int32])
def test_writes_match_eager(options, dtype, offsets_dtype):
    # (a Ragged's total is dynamic from the start: one compile of each function serves every
    # lengths below, as a fresh compile per lengths would, total 0 recompiling in both)
    failures = ember.stats()["build_failures"]
    pad, pad_report = compile_checked(_pad, options=options)
    accumulate, report = compile_checked(_accumulate, options=options)
    for lengths in ([2, 0, 6, 1], [0, 0, 0, 0], [6, 0, 0, 0], [1, 5, 0, 3]):
        r = _ragged(lengths, dtype=dtype, offsets_dtype=offsets_dtype)
        assert_same(pad(r), _pad(r))
        dense = torch.randn(len(lengths), 6, F).to(dtype).to(DEVICE)
        assert_same(accumulate(dense.clone(), r), _accumulate(dense.clone(), r))
    assert_clean(pad_report)
    assert_clean(report)
    assert ember.stats()["build_failures"] == failures, "a kernel fell back to ATen at its first launch"
    assert not [k.name for k in report.kernels if "atomic" in k.source]


def test_feature_less_and_wide_rows_and_non_contiguous_values():
    r = _ragged([3, 0, 2], feature=())
    check(_pad, r)
    wide = torch.randn(5, 2 * F).to(DEVICE)
    r = Ragged(wide[:, ::2], torch.tensor([0, 4, 5]).to(DEVICE))  # strided values
    assert not r.values.is_contiguous()
    check(_pad, r)
    check(lambda r: r.to_padded(0.0, max_length=4).sum(1), _ragged([4, 1, 2], feature=(3, 5)))


def test_one_program_serves_every_total_and_writes_without_a_copy_or_atomics():
    fn, report = compile_checked(_accumulate)  # a Ragged's total length is dynamic from the start
    for lengths in ([2, 0, 6, 1], [1, 1, 1, 1], [6, 6, 6, 6], [0, 0, 0, 2]):
        r = _ragged(lengths, seed=len(lengths) + sum(lengths))
        dense = torch.randn(4, 6, F).to(DEVICE)
        assert_same(fn(dense, r), _accumulate(dense, r))
    assert_clean(report)
    assert len(report.graphs) == 1 and len(report.kernels) == 1
    assert "atomic" not in report.kernels[0].source and "copy_(" not in report.graphs[0].wrapper


def test_batch_sizes_that_change_write_by_gathers_without_recompiling():
    """Dense rows and sequences counted by two size symbols (a batch size that changes between
    calls, and dense rows that may outnumber the sequences): still one gather, no atomics, and
    one graph for every batch size."""
    fn, report = compile_checked(_accumulate, dynamic=True)
    for lengths, rows in (([2, 0, 6, 1], 4), ([1, 5], 2), ([3, 0, 0, 2, 2], 5), ([3, 1], 6), ([2, 0, 0], 2)):
        r = _ragged(lengths)
        dense = torch.randn(rows, 6, F).to(DEVICE)
        assert_same(fn(dense, r), _accumulate(dense, r))
    assert_clean(report)
    assert len(report.graphs) == 1 and len(report.kernels) == 1
    assert "atomic" not in report.kernels[0].source
    if DEVICE == "cpu":  # (a device assert on the GPU would end the process's CUDA context)
        dense, r = torch.zeros(2, 6, F), _ragged([1, 0, 2])  # the third sequence has no dense row
        with pytest.raises(IndexError):
            _accumulate(dense, r)
        with pytest.raises(IndexError):
            fn(dense, r)


def test_a_sequence_longer_than_the_dense_rows_raises_as_eager_does():
    if DEVICE != "cpu":  # eager's device-side assert would end the process's CUDA context
        pytest.skip("out-of-range indices clamp on the GPU, without a host sync (ember's GPU policy)")
    r = _ragged([2, 7])  # 7 > 6
    dense = torch.zeros(2, 6, F)
    with pytest.raises(IndexError):
        _accumulate(dense, r)
    with pytest.raises(IndexError):
        ember.compile(_accumulate)(dense, r)


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
def test_gradients_of_a_gather_from_a_dense_partner(options):
    """d/d(dense) of dense[row_ids, positions] is the write this pass turns into a gather; the
    gradient to the ragged values flows too. The backward is one kernel, no fill, no atomics."""
    def loss(dense, r):
        matched = dense[r.row_ids(), r.positions()]
        return ((matched.sin() * r.values).sum(1) ** 2).mean()

    fn, report = compile_checked(loss, options=options)
    for seed, lengths in enumerate(([2, 0, 6, 1], [3, 3, 1, 0], [0, 1, 0, 6])):
        r = _ragged(lengths, seed=seed)
        values = r.values.clone().requires_grad_()
        mine = Ragged(values, r.offsets)
        ref_values = r.values.clone().requires_grad_()
        dense = torch.randn(4, 6, F, device=DEVICE)
        d_mine, d_ref = dense.clone().requires_grad_(), dense.clone().requires_grad_()
        fn(d_mine, mine).backward()
        loss(d_ref, Ragged(ref_values, r.offsets)).backward()
        assert_same([d_mine.grad, values.grad], [d_ref.grad, ref_values.grad])
    assert_clean(report)
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    writes = [k for k in backward.kernels if k.source.count("atomic") or "zero_()" in backward.wrapper]
    assert not writes, backward.wrapper


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
def test_positions_computed_inside_the_gather_match_eager(options):
    """The gather reads the values padded by one row at a clamped place; positions (and
    anything else computed from a range) read there were taken as 0: writes of positions, a
    positional weight's gradient and d[i] + v all came out wrong, silently."""
    r = Ragged(torch.ones(6, dtype=torch.float64).to(DEVICE), torch.tensor([0, 3, 4, 6]).to(DEVICE))
    base = (torch.arange(12, dtype=torch.float64) * 100).reshape(3, 4).to(DEVICE)

    def write_positions(r, d):
        return d.index_put((r.row_ids(), r.positions()), r.positions().double())

    def weighted_gradient(r, d):
        d = d.clone().requires_grad_()
        weighted = d[r.row_ids(), r.positions()] * (1.0 + r.positions().double())
        return torch.autograd.grad(weighted.sum(), d)[0]

    def padded_positions(r):
        return Ragged._make(r.values * r.positions(), r.offsets, r.max_length).to_padded()

    def read_and_write(r, d):
        at = (r.row_ids(), r.positions())
        return d.index_put(at, d[at] + r.values), d.index_put(at, d[at] * 2)

    for fn, args in ((write_positions, (r, base)), (weighted_gradient, (r, base)), (padded_positions, (r,)),
                     (read_and_write, (r, base))):
        check(fn, *args, options=options)


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
def test_empty_rows_index_nothing(options):
    """A segment kernel checks a row's lookups once, before its loop over the row: an empty row
    (whose lookups eager never makes) raised IndexError."""
    def gather(r, d):
        return d[r.row_ids(), r.positions()] * r.values

    def lookup(r, table, classes):
        return r.values * table[classes[r.row_ids()]]

    values = torch.randn(4, 3, dtype=torch.float64).to(DEVICE)
    check(gather, Ragged(values[:2], torch.tensor([0, 2, 2]).to(DEVICE)),
          torch.randn(1, 4, 3, dtype=torch.float64).to(DEVICE), options=options)  # row 1: no dense row, empty
    check(lookup, Ragged(values, torch.tensor([0, 2, 2, 4]).to(DEVICE)),
          torch.randn(5, 3, dtype=torch.float64).to(DEVICE), torch.tensor([0, 99, 1]).to(DEVICE), options=options)
    if options is None:  # a row with elements still checks (Triton kernels clamp, as on the GPU)
        r = Ragged(torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 2, 3, 5]))
        table, classes = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 99, 1])
        with pytest.raises(IndexError):
            lookup(r, table, classes)
        with pytest.raises(IndexError):
            ember.compile(lookup, options=options)(r, table, classes)
