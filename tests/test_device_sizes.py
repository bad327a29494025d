"""Ragged totals read on the device (schedule/device_sizes.py), the sizes a program still takes
from the host (runtime/capture.py), and ``ember.cuda_graph``, which relies on both: one capture
serves every batch of at most its capacity's rows."""

from __future__ import annotations

import warnings

import pytest
import sympy
import torch

import ember
from ember.cudagraphs import CudaGraphStep, capacity_for
from ember.ir import dtypes as dt
from ember.ir.builder import GraphBuilder
from ember.ir.node import ragged_totals
from ember.ir.ops import Op
from ember.ragged import Ragged
from ember.runtime import capture
from ember.workloads.giou import make_batch, ragged_giou_loss
from ember.workloads.giou_bench import pack

from .conftest import DEVICE

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
    return b.build(b.op(Op.SEARCH, b.slice(offsets, 0, start, 1, 4), iota, arg=True))


def test_ragged_totals_pairs_the_row_ids_length_with_its_offsets():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    graph = _row_ids_graph(s0)
    assert {s: n.arg.name for s, n in ragged_totals(graph).items()} == {s0: "arg0"}
    assert ragged_totals(_row_ids_graph(s0, start=0)) == {}   # not offsets[1:]: no row ids
    assert ragged_totals(_row_ids_graph(2 * s0)) == {}        # T is no size symbol of its own
    assert ragged_totals(_row_ids_graph(sympy.Integer(7))) == {}  # a static T needs no reading
    pred, r = _giou_batch()
    report = ember.explain(ragged_giou_loss, pred, r)
    assert "(read on the device)" in report.graphs[0].kernels[0].kernel_ir


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
    loss = f(p, _with_capacity(r, r.total_length + 37))  # ... and run with more rows than T
    loss.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(p.grad, p_ref.grad)


@pytest.mark.parametrize("target", ["cpp", "cuda", "triton"])
def test_rendered_kernels_load_the_total(target):
    pred, r = _giou_batch()
    report = ember.explain(ragged_giou_loss, pred.requires_grad_(), r, target=target)
    sources = [k.source for g in report.graphs for k in g.kernels]
    assert len(sources) == 2  # the forward and the backward kernel
    # T = offsets[B]: Triton spells it tl.load(offsets + B), C and CUDA (int64_t)offsets[B]
    element = f"+ {r.batch_size})" if target == "triton" else f"[{r.batch_size}];"
    load = "tl.load(" if target == "triton" else "(int64_t)"
    for source in sources:
        loads = [line for line in source.splitlines() if "ragged total" in line]
        assert len(loads) == 1 and load in loads[0] and element in loads[0], source


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
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_cuda_graph_serves_every_box_count_from_one_capture(backend):
    pred, _ = _giou_batch(64, 0, "cuda")
    pred.requires_grad_()
    step = ember.cuda_graph(_train_step(ember.compile(ragged_giou_loss, options={"gpu_backend": backend})))
    totals = []
    for seed in range(6):
        _, r = _giou_batch(64, seed, "cuda")
        totals.append(r.total_length)
        loss = step(pred, r)
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
