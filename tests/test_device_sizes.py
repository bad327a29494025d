"""Ragged totals read on the device (schedule/device_sizes.py), the sizes a program still takes
from the host (runtime/capture.py), and ``ember.cuda_graph``, which relies on both: one capture
serves every batch of at most its capacity's rows."""

from __future__ import annotations

import warnings

import pytest
import sympy
import torch

import ember
from ember.cudagraphs import CudaGraphStep, _Capture, _copy_in, _packed_layout, _static, capacity_for
from ember.ir import dtypes as dt
from ember.ir.builder import GraphBuilder
from ember.ir.node import ragged_totals
from ember.ir.ops import Op
from ember.ragged import Ragged, collate, segment_mean
from ember.runtime import capture
from ember.runtime.driver_copies import tensor_copy
from ember.workloads.giou import make_batch, ragged_giou_loss
from ember.workloads.giou_bench import pack

from .conftest import DEVICE
from .helpers import assert_same

# the compiled targets of the test device (Triton runs interpreted on the CPU)
TARGETS = [None, {"target": "triton"}] if DEVICE == "cpu" else [{"gpu_backend": "triton"}, {"gpu_backend": "cuda"}]
TARGET_IDS = ["cpp", "triton"] if DEVICE == "cpu" else ["triton", "cuda"]


def _giou_batch(batch: int = 24, seed: int = 0, device: str = "cpu"):
    pred, targets, _ = make_batch(batch, torch.float32, seed)
    return pred.to(device), pack(targets, torch.device(device))


def _with_capacity(r: Ragged, rows: int) -> Ragged:
    """``r``'s values in a buffer of ``rows`` rows, NaN past its total length: what a capacity
    replay hands the kernels (the host sees ``rows`` rows, the offsets end at T)."""
    values = r.values.new_full((rows, *r.feature_shape), float("nan"))
    values[:r.total_length] = r.values
    return Ragged._make(values, r.offsets, r.max_length)


def _row_ids_graph(length, start: int = 1):
    b = GraphBuilder()
    offsets = b.input((5,), dt.int64)
    iota = b.op(Op.IOTA, arg=(length, 0, 1), dtype=dt.int64)
    return b.build(b.op(Op.SEARCH, b.slice(offsets, 0, start, 1, 4), iota, arg=(True, True)))


def test_ragged_totals_pairs_the_row_ids_length_with_its_offsets():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    graph = _row_ids_graph(s0)
    assert {s: n.arg.name for s, n in ragged_totals(graph).items()} == {s0: "arg0"}
    assert ragged_totals(_row_ids_graph(s0, start=0)) == {}   # not offsets[1:]: no row ids
    assert ragged_totals(_row_ids_graph(2 * s0)) == {}        # T is no size symbol of its own
    assert ragged_totals(_row_ids_graph(sympy.Integer(7))) == {}  # a static T needs no reading
    pred, r = _giou_batch()
    report = ember.explain(ragged_giou_loss, pred, r)
    assert "(read on the device in graphed steps)" in report.graphs[0].kernels[0].kernel_ir


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
def test_kernels_read_the_total_from_the_offsets(options):
    # values of 61 rows, the last 37 NaN, offsets ending at 24: kernels that took T from the host
    # would sum the NaN rows into the loss and divide by 61
    pred, r = _giou_batch(device=DEVICE)
    f = ember.compile(ragged_giou_loss, options=options)
    p_ref, p = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    ref = ragged_giou_loss(p_ref, r)
    ref.backward()
    f(p, r)  # compiled with T = r.total_length ...
    p.grad = None
    with capture.totals_on_device():  # ... and run as ember.cuda_graph runs it, with more rows than T
        loss = f(p, _with_capacity(r, r.total_length + 37))
        loss.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(p.grad, p_ref.grad)
    # outside a graphed step the host's T counts: the rows past the offsets' end belong to no
    # image, and index past the predictions, as in eager (checked where an index error is no
    # device assert, which would end the test process)
    for fn in (ragged_giou_loss, f) if options is None else ():
        with pytest.raises(IndexError):
            fn(p.detach(), _with_capacity(r, r.total_length + 37))


@pytest.mark.parametrize("target", ["cpp", "cuda", "triton"])
def test_rendered_kernels_load_the_total(target):
    pred, r = _giou_batch()
    report = ember.explain(ragged_giou_loss, pred.requires_grad_(), r, target=target)
    sources = [k.source for g in report.graphs for k in g.kernels]
    assert len(sources) == 2  # the forward and the backward kernel
    # T = offsets[B]: Triton spells it tl.load(offsets + B), C and CUDA (int64_t)offsets[B]; never
    # more than the host's T, which sized the buffers
    # (B, the offsets' length less 1, is a size symbol: batch sizes change too)
    element = " + s" if target == "triton" else " - 1])"
    load = "tl.load(" if target == "triton" else "(int64_t)"
    smaller = "tl.minimum(" if target == "triton" else "ember_imin("
    # only in ember.cuda_graph steps: the host passes device_totals = 1 there, 0 elsewhere
    graphed = "(1 - device_totals)" if target == "triton" else "if (device_totals)"
    for source in sources:
        loads = [line for line in source.splitlines() if "ragged total" in line]
        assert len(loads) == 1 and load in loads[0] and element in loads[0] and smaller in loads[0], source
        assert graphed in loads[0], source


@pytest.mark.parametrize("options", TARGETS, ids=TARGET_IDS)
def test_searches_like_row_ids_of_other_offsets_match_eager(options):
    """searchsorted(o[1:], arange(n), right=True) is what row_ids() runs, but written by hand it
    may search offsets that start past 0 or end before or past n (bucketing n items). Read as
    ragged rows, such code wrote past its output (n < o[-1]), left rows uncomputed (n > o[-1]),
    and gave segment kernels, segment sums and gathers wrong rows (o[0] > 0). Only Ragged's own
    row ids (ember::row_ids) are read so."""
    search = lambda o, n: torch.searchsorted(o[1:], torch.arange(n, device=o.device), right=True)  # noqa: E731

    def buckets(o, x, table):
        return x * table[search(o, x.shape[0])].unsqueeze(-1)

    def summed(o, x):
        return torch.zeros(o.shape[0] - 1, x.shape[1], dtype=x.dtype, device=x.device).index_add(
            0, search(o, x.shape[0]), x)

    compiled = [ember.compile(f, dynamic=True, options=options) for f in (buckets, summed, search)]
    strided = torch.tensor([[0, 9], [3, 9], [3, 9], [5, 9], [8, 9]], device=DEVICE)[:, 0]
    cases = [(torch.tensor(o, device=DEVICE), n) for o, n in (([0, 3, 5, 8], 8), ([0, 2, 9], 5), ([0, 5, 6, 9], 4),
                                                            ([0, 2, 4], 9), ([3, 4, 6, 9], 9), ([0, 2, 5, 5, 7], 10))]
    for o, n in [*cases, (strided, 8)]:
        x = torch.randn(n, 3, dtype=torch.float64, device=DEVICE)
        weights = torch.randn(o.shape[0], dtype=torch.float64, device=DEVICE)  # B + 1: row B exists
        assert_same(compiled[0](o, x, weights), buckets(o, x, weights))
        assert_same(compiled[2](o, n), search(o, n))
        if int(o[-1]) >= n:  # (else eager raises: a row id past the sums)
            assert_same(compiled[1](o, x), summed(o, x))


def _host_sizes(fn, *args) -> list[capture.ProgramRun]:
    with capture.check_programs() as check:
        out = fn(*args)
        if out.requires_grad:
            out.backward()
    return check.runs


def test_programs_report_sizes_taken_from_the_host():
    pred, r = _giou_batch()
    giou = ember.compile(ragged_giou_loss)
    runs = _host_sizes(giou, pred.clone().requires_grad_(), r)
    assert [run.host_sizes for run in runs] == [{}, {}]  # forward and backward: all on the device
    # no row ids: nothing ties T to the offsets, so the mean divides by the host's T
    plain_mean = ember.compile(lambda r: r.values.mean())
    (run,) = _host_sizes(plain_mean, r)
    assert list(run.host_sizes.values()) == [r.total_length]


def test_capacity_for():
    assert capacity_for(0) == capacity_for(65) == 65
    assert capacity_for(66) == 129
    assert capacity_for(2500) == 4097
    assert all(capacity_for(t) % 2 == 1 and capacity_for(t) >= t for t in range(0, 5000, 7))


def test_cuda_graph_argument_errors():
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        ember.cuda_graph(lambda x: x, capacity=0)
    with pytest.raises(ValueError, match="warmup must be at least 1"):
        ember.cuda_graph(lambda x: x, warmup=0)
    # (these were taken, and failed at the call: '<' between str and int, an int not iterable,
    # a 5 "needing a CUDA device")
    for bad in ({"warmup": "2"}, {"warmup": 1.5}, {"static_args": 0}):
        with pytest.raises(TypeError, match=f"{next(iter(bad))} must be"):
            ember.cuda_graph(lambda x: x, **bad)
    with pytest.raises(TypeError, match="cuda_graph takes a function"):
        ember.cuda_graph(5)
    step = ember.cuda_graph(lambda x: x * 2)
    assert isinstance(step, CudaGraphStep)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="need a CUDA device"):
            step(torch.ones(3))
    x = torch.ones(3, requires_grad=True) * 2  # not a leaf
    with pytest.raises(ValueError, match="not a leaf"):
        step(x)
    with pytest.raises(TypeError, match="not a tensor, a Ragged or hashable"):
        step(torch.ones(1), _Unhashable())
    with pytest.raises(ValueError, match="static_args must be positions"):
        ember.cuda_graph(lambda x: x, static_args=("x",))
    with pytest.raises(ValueError, match="names argument 1, but the step got 1"):
        ember.cuda_graph(lambda x: x, static_args=(1,))(torch.ones(3))
    values = torch.ones(3, 2, requires_grad=True) * 2  # computed: the graph cannot reach its leaf
    with pytest.raises(ValueError, match="ragged values require grad but are not a leaf"):
        step(Ragged(values, torch.tensor([0, 1, 3])))


def test_cuda_graph_keys_scalar_arguments_without_pytree(monkeypatch):
    """A call whose arguments are tensors, Ragged values, None and scalars skips pytree's
    flattening (10-20 µs of host time a call) and still tells its constants apart; keyword
    arguments take pytree's path. The capture is faked: the key logic is host-only."""
    import torch.utils._pytree as pytree

    captured = []

    def fake_capture(self, leaves, spec, capacities, in_place=frozenset(), *parameters):
        captured.append(spec)
        return _Capture(type("Graph", (), {"replay": lambda self: None})(), list(leaves), len(captured), capacities)

    monkeypatch.setattr(CudaGraphStep, "_capture", fake_capture)
    flatten = pytree.tree_flatten
    flattened = []
    monkeypatch.setattr(pytree, "tree_flatten", lambda *a, **k: flattened.append(1) or flatten(*a, **k))
    step = ember.cuda_graph(lambda *a, **k: None, static_args=(0,))
    x = torch.ones(3)
    assert step(x, None, 2.0) == step(x, None, 2.0) == 1
    assert step(x, None, 3.0) == 2 and step(x, 1, 2.0) == 3 and step(x, None, "a") == 4
    assert captured == [3, 3, 3, 3] and not flattened
    assert step(x, None, scale=2.0) == 5 and flattened  # keywords: pytree's path


def test_cuda_graph_copies_a_packed_batch_into_its_buffers_at_once():
    """Static buffers of a ``collate``'d batch keep its layout (offsets, then values), so any
    later batch's bytes up to its values' end are one copy; a batch laid out otherwise (a second
    ragged field, whose values move with the first's length) still lands right, field by field."""
    def batch(seed, fields=1):
        g = torch.Generator().manual_seed(seed)
        samples = [tuple(torch.randn(int(n), 4, generator=g) for _ in range(fields))
                   for n in torch.randint(0, 9, (6,), generator=g)]
        return collate(samples, ragged_fields=list(range(fields)), pin_memory=False)

    first = batch(0)[0]
    layout = _packed_layout(first)
    assert layout is not None and layout[0] < layout[1]  # offsets first
    static, (packed, kept) = _static(first, 129, False, torch.device("cpu"))
    static.values.requires_grad_()  # as for values that require grad: copies stay out of autograd
    entry = _Capture(None, [static], None, {0: 129}, {0: (packed, kept)}, copied=[0])
    for seed in range(4):
        r = batch(seed)[0]
        assert _packed_layout(r) == layout
        _copy_in(entry, [r])
        assert torch.equal(static.offsets, r.offsets) and static.values.shape[0] == 129
        assert torch.equal(static.values[:r.total_length], r.values)
    two = batch(5, fields=2)[1]  # values after the first field's, which vary
    assert _packed_layout(two) != layout
    _copy_in(entry, [two])
    assert torch.equal(static.offsets, two.offsets) and torch.equal(static.values[:two.total_length], two.values)
    assert _packed_layout(Ragged(torch.randn(3, 4), torch.tensor([0, 1, 3]))) is None  # two tensors


def test_driver_copies_take_dense_prefixes_only():
    dst, src = torch.empty(9, 4), torch.randn(5, 4)
    assert tensor_copy(dst, src) == (dst.data_ptr(), src.data_ptr(), 80, True)
    assert tensor_copy(torch.empty(3), torch.randn(3)) is not None
    assert tensor_copy(dst, src.double()) is None            # a cast: copy_
    assert tensor_copy(dst, torch.randn(4, 5).t()) is None   # strided: copy_
    assert tensor_copy(dst, torch.randn(5, 3)) is None       # other rows
    assert tensor_copy(torch.empty(4, 4), src) is None       # more rows than the buffer


class _FakeDriver:
    """The driver calls DriverCopies makes, recorded; an event completes when ``done`` says so."""

    def __init__(self):
        self.copies, self.records, self.done = [], [], set()

    def cuMemcpyHtoDAsync_v2(self, dst, src, n, stream):
        self.copies.append((dst, stream))
        return 0

    def cuEventCreate(self, out, flags):
        out._obj.value = 1000 + len(self.records) + len(self.done) + len(self.copies)
        return 0

    def cuEventRecord(self, event, stream):
        self.records.append((event.value, stream))
        return 0

    def cuEventQuery(self, event):
        return 0 if event.value in self.done else 600  # CUDA_ERROR_NOT_READY


def test_driver_copies_keep_host_sources_until_an_event_after_their_copies(monkeypatch):
    """One event covers RELEASE_EVERY calls' host sources (an event a call cost host time); a
    source is dropped only once an event recorded after its copy has completed, and a call on
    another stream first seals the held sources with an event on theirs."""
    from ember.runtime import driver_copies
    fake, stream = _FakeDriver(), [7]
    monkeypatch.setattr(driver_copies, "_libcuda", lambda: fake)
    monkeypatch.setattr(driver_copies, "_current_stream", lambda device: stream[0])
    copier = driver_copies.DriverCopies(torch.device("cuda", 0))
    sources = [torch.empty(2) for _ in range(2 * driver_copies.RELEASE_EVERY + 1)]
    held = lambda: {id(t) for t in copier._held} | {id(t) for _, ts in copier._pending for t in ts}  # noqa: E731
    for n, src in enumerate(sources[:driver_copies.RELEASE_EVERY], 1):
        copier.copy([(16 * n, src.data_ptr(), 8, True)], [src])
    assert len(fake.copies) == driver_copies.RELEASE_EVERY and len(fake.records) == 1
    assert held() == {id(t) for t in sources[:driver_copies.RELEASE_EVERY]}  # the event has not completed
    fake.done.add(fake.records[0][0])
    for src in sources[driver_copies.RELEASE_EVERY:-1]:
        copier.copy([(0, src.data_ptr(), 8, True)], [src])
    assert len(fake.records) == 2   # the first event's sources released
    assert held() == {id(t) for t in sources[driver_copies.RELEASE_EVERY:-1]}
    stream[0] = 9
    copier.copy([(0, sources[-1].data_ptr(), 8, True)], [sources[-1]])
    copier.copy([(0, sources[-1].data_ptr(), 8, True)], [])   # no host source: nothing held
    assert len(fake.records) == 2 and fake.copies[-1][1] == 9
    stream[0] = 7
    copier.copy([(0, sources[0].data_ptr(), 8, True)], [sources[0]])
    # the held source's copy ran on stream 9: sealed there, with the first (completed) event again
    assert fake.records[-1] == (fake.records[0][0], 9)
    assert id(sources[-1]) in held()


class _Unhashable:
    __hash__ = None


gpu = pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                         reason="CUDA graphs need a GPU (EMBER_TEST_DEVICE=cuda)")


def _train_step(loss_fn):
    def step(p, targets):
        p.grad = None
        loss = loss_fn(p, targets)
        loss.backward()
        return loss
    return step


@gpu
@pytest.mark.parametrize("backend,targets_on", [("triton", "cuda"), ("cuda", "cuda"), ("triton", "cpu")])
def test_cuda_graph_serves_every_box_count_from_one_capture(backend, targets_on):
    """Targets on the GPU are copied into the graph's buffers; targets still in ``collate``'s
    pinned host buffer are copied there straight from the host."""
    pred, _ = _giou_batch(64, 0, "cuda")
    pred.requires_grad_()
    step = ember.cuda_graph(_train_step(ember.compile(ragged_giou_loss, options={"gpu_backend": backend})))
    totals = []
    for seed in range(6):
        _, batch = _giou_batch(64, seed, targets_on)
        assert batch.device.type == targets_on and (targets_on == "cuda" or batch.values.is_pinned())
        r = Ragged(batch.values.cuda(), batch.offsets.cuda())
        totals.append(r.total_length)
        loss = step(pred, batch)
        assert loss.is_cuda
        p64 = pred.detach().double().requires_grad_()
        ref = ragged_giou_loss(p64, r.to(torch.float64))
        ref.backward()
        torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pred.grad.double(), p64.grad, rtol=1e-4, atol=1e-7)
    assert len(set(totals)) > 1 and step.exact_reason is None
    assert len(step.captures) == len({capacity_for(t) for t in totals})


@gpu
def test_cuda_graph_captures_exactly_when_something_takes_the_total_from_the_host():
    pred, r = _giou_batch(64, 0, "cuda")
    pred.requires_grad_()
    giou = ember.compile(ragged_giou_loss)

    def loss_fn(p, targets):  # the eager sum over the values reads every row the host sees
        return giou(p, targets) + 0 * targets.values.sum()

    step = ember.cuda_graph(_train_step(loss_fn))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed in range(3):
            _, r = _giou_batch(64, seed, "cuda")
            loss = step(pred, r)
            torch.testing.assert_close(loss, ragged_giou_loss(pred.detach(), r))
    assert step.exact_reason is not None and "aten::sum" in step.exact_reason
    assert sum("exact total length" in str(w.message) for w in caught) == 1


def _pool_step():
    """A training step of ember's segment mean: the gradient goes to the ragged values."""
    pool = ember.compile(segment_mean)

    def step(r, upstream):
        r.values.grad = None
        out = pool(r)
        out.backward(upstream)
        return out
    return step


@gpu
def test_cuda_graph_hands_on_the_gradient_of_ragged_values():
    """Ragged values that require grad: each call's ``values.grad`` is the graph's gradient of
    that batch's T rows, as eager's backward gives it."""
    step = _pool_step()
    graphed = ember.cuda_graph(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # whether T is read on the device is not this test's point
        for seed in range(4):
            g = torch.Generator().manual_seed(seed)
            lengths = torch.randint(0, 40, (8,), generator=g)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda()
            values = torch.randn(int(lengths.sum()), 16, generator=g).cuda().requires_grad_()
            upstream = torch.randn(8, 16, generator=g).cuda()
            out = graphed(Ragged(values, offsets), upstream)
            ref_values = values.detach().clone().requires_grad_()
            ref = segment_mean(Ragged(ref_values, offsets))
            ref.backward(upstream)
            torch.testing.assert_close(out, ref)
            assert values.grad is not None and values.grad.shape == values.shape
            torch.testing.assert_close(values.grad, ref_values.grad)


@gpu
def test_cuda_graph_reads_static_args_where_they_are():
    """An argument named in ``static_args`` is not copied: the graph reads the tensors it was
    captured with, so new contents written into them are the next call's inputs, and other
    tensors capture again."""
    step = _pool_step()
    graphed = ember.cuda_graph(step, static_args=(0, 1))
    offsets = torch.tensor([0, 3, 3, 10, 16], device="cuda")
    values = torch.randn(16, 8, device="cuda", requires_grad=True)
    upstream = torch.randn(4, 8, device="cuda")
    r = Ragged(values, offsets)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            with torch.no_grad():
                values.normal_()
            upstream.normal_()
            out = graphed(r, upstream)
            ref_values = values.detach().clone().requires_grad_()
            ref = segment_mean(Ragged(ref_values, offsets))
            ref.backward(upstream)
            torch.testing.assert_close(out, ref)
            torch.testing.assert_close(values.grad, ref_values.grad)
        assert len(graphed.captures) == 1
        graphed(Ragged(values.detach().clone().requires_grad_(), offsets), upstream)
        assert len(graphed.captures) == 2  # other tensors: another capture


def test_kernels_reading_a_total_on_the_device_never_run_through_aten_meanwhile(tmp_path):
    # A new Triton specialization compiles in the background while calls run through ATen; a
    # kernel that reads its ragged total on the device runs under ember.cuda_graph on buffers of
    # more rows than the total, which ATen reads whole: the GIoU step's capture hit a device
    # assert (an index out of bounds) in that ATen run
    from ember.config import Config
    from ember.runtime.triton_backend import Launcher
    from ember.runtime.triton_tuner import Tuner

    meta = {"kind": "rows", "outer": "s0", "inner": "4", "sizes": ["s0"], "params": ["a"], "multi_program": False,
            "split_rows": False, "n_reductions": 1, "chunks": 0, "row_reductions": 0, "aligned": False}
    cfg = Config(background_compile=True)
    plain = Launcher("k", None, meta, "h", Tuner(tmp_path / "t.json"), fallback=lambda *a: None, cfg=cfg)
    ragged = Launcher("k", None, {**meta, "device_sizes": True}, "h", Tuner(tmp_path / "t.json"),
                      fallback=lambda *a: None, cfg=cfg)
    plain._compiled_once = ragged._compiled_once = True
    assert not ragged._may_compile_later(torch.device("cuda"))
    if torch.cuda.is_available():  # (asking whether a stream is capturing needs CUDA)
        assert plain._may_compile_later(torch.device("cuda"))
    pred, r = _giou_batch()
    report = ember.explain(ragged_giou_loss, pred, r, target="triton")
    assert "read on the device" in report.graphs[0].kernels[0].kernel_ir
