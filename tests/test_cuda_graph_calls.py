"""Calls of an ``ember.cuda_graph`` step: the last call's arguments again skip the capture key,
and parameters' gradients follow eager's rules (each capture writes its own gradient buffers, so
a call must hand on the buffer of the capture that ran, and a gradient the caller set to None,
``zero_grad()``, must start from zero)."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember
from ember import cudagraphs
from ember.cudagraphs import CudaGraphStep, _Capture, _grad_buffers, _grad_leaves, capacity_for
from ember.ragged import Ragged
from ember.workloads.giou import make_batch, ragged_giou_loss
from ember.workloads.giou_bench import pack

from .conftest import DEVICE

gpu = pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                         reason="CUDA graphs need a GPU (EMBER_TEST_DEVICE=cuda)")


@pytest.fixture
def fake_captures(monkeypatch):
    """Captures faked (host-only): each returns a new entry numbered in order; ``keys`` counts
    the keys built."""
    made, keys = [], []

    def fake_capture(self, leaves, spec, capacities, in_place=frozenset(), *parameters):
        made.append(spec)
        entry = _Capture(type("Graph", (), {"replay": lambda self: None})(), list(leaves), len(made), capacities)
        # what a capture copies in: tensors not read in place and not parameters (no real copy here)
        entry.copied = [i for i, leaf in enumerate(leaves) if i not in in_place and (
            isinstance(leaf, Ragged) or isinstance(leaf, torch.Tensor) and not leaf.requires_grad)]
        return entry

    key = CudaGraphStep._key
    monkeypatch.setattr(CudaGraphStep, "_capture", fake_capture)
    monkeypatch.setattr(CudaGraphStep, "_key", lambda self, *a: keys.append(1) or key(self, *a))
    return keys


def test_the_same_arguments_again_skip_the_key(fake_captures):
    """Arguments read in place (static_args), parameters and constants: the same objects again,
    with the same storage and layout, replay the last capture without building its key."""
    keys = fake_captures
    x = torch.ones(4, 3)
    w = torch.ones(3, requires_grad=True)
    r = Ragged(torch.randn(5, 2), torch.tensor([0, 2, 5]))
    step = ember.cuda_graph(lambda *a: None, static_args=(0, 2))
    assert step(x, w, r, 1.5) == step(x, w, r, 1.5) == step(x, w, r, 1.5) == 1
    assert len(keys) == 1
    assert step(x, w, r, 2.5) == 2 and len(keys) == 2           # another constant
    assert step(x, w, r, 2.5) == 2 and len(keys) == 2
    assert step(x.clone(), w, r, 2.5) == 3 and len(keys) == 3   # another tensor
    assert step(x, w, r, 2.5) == 2 and len(keys) == 4           # back: a key, the capture it had
    x.resize_(3, 4)                                             # same object, another layout
    assert step(x, w, r, 2.5) == 4 and len(keys) == 5
    r.values = torch.randn(5, 2)                                # a Ragged's part replaced
    assert step(x, w, r, 2.5) == 5 and len(keys) == 6
    assert step(x, w, r, scale=2.5) == 6 and len(keys) == 7     # keywords: the key's path
    assert step(x, w, r, scale=2.5) == 6 and len(keys) == 8


def test_copied_arguments_always_build_the_key(fake_captures, monkeypatch):
    """A copied argument (its contents go into the capture's buffers) may change shape or total
    length between calls of the same object: every call builds the key and copies in."""
    keys, copies = fake_captures, []
    monkeypatch.setattr(cudagraphs, "_copy_in", lambda entry, leaves, copier=None: copies.append(1))
    x = torch.ones(4, 3)
    step = ember.cuda_graph(lambda x: None)
    step(x)
    step(x)
    assert len(keys) == 2 and len(copies) == 2


def test_grad_buffers_tell_assigned_accumulated_and_untouched_gradients():
    assigned = torch.randn(3, requires_grad=True)      # from None: the backward allocates
    accumulated = torch.randn(3, requires_grad=True)   # an existing gradient, added to in place
    accumulated.grad = torch.ones(3)
    untouched = torch.randn(3, requires_grad=True)
    untouched.grad = torch.ones(3)
    never = torch.randn(3, requires_grad=True)
    params = (assigned, accumulated, untouched, never)
    before = [(t, t.grad, None if t.grad is None else t.grad._version) for t in params]
    (assigned * 2 + accumulated * 3).sum().backward()
    got_assigned, got_accumulated = _grad_buffers(before)
    assert [(p is assigned, g is assigned.grad) for p, g in got_assigned] == [(True, True)]
    assert [(p is accumulated, g is accumulated.grad) for p, g in got_accumulated] == [(True, True)]


def test_grad_leaves_find_a_closures_parameters():
    model = torch.nn.Linear(4, 2)
    found = {id(t) for t in _grad_leaves()}
    assert id(model.weight) in found and id(model.bias) in found
    assert id(torch.randn(2)) not in found  # no gradient wanted


def _batch(seed: int, boxes: int) -> Ragged:
    """GIoU targets of 64 images with at most ``boxes`` boxes in all (images past that have none)."""
    _, targets, _ = make_batch(64, torch.float32, seed)
    total, kept = 0, []
    for t in targets:
        n = min(t.shape[0], boxes - total)
        kept.append(t[:n])
        total += n
    return pack(kept, torch.device("cuda"))


def _pred(seed: int = 0) -> torch.Tensor:
    pred, _, _ = make_batch(64, torch.float32, seed)
    return pred.cuda()


def _expected_grad(pred: torch.Tensor, r: Ragged) -> torch.Tensor:
    p64 = pred.detach().double().requires_grad_()
    ragged_giou_loss(p64, r.to(torch.float64)).backward()
    return p64.grad


def _close(grad: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-7)


# batches of two capacities (65 and 129 boxes), called in turns: A, B, A, B, A
BOXES = (60, 120, 50, 110, 64)


@gpu
def test_each_capture_hands_on_its_own_gradient_buffer():
    """The step sets ``p.grad = None``: each capture's backward allocates its buffer. Calls of
    the first capture after the second was made must hand on the first's buffer, including
    when the caller still holds the first gradient (so the second capture could not reuse it)."""
    assert len({capacity_for(n) for n in BOXES}) == 2
    pred = _pred().requires_grad_()
    loss_fn = ember.compile(ragged_giou_loss)

    def step(p, r):
        p.grad = None
        loss = loss_fn(p, r)
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step)
    held = []
    for i, n in enumerate(BOXES):
        r = _batch(i, n)
        graphed(pred, r)
        held.append(pred.grad)
        _close(pred.grad, _expected_grad(pred, r))
    assert graphed.exact_reason is None and len(graphed.captures) == 2


class _Boxes(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pred = torch.nn.Parameter(_pred())


@gpu
def test_zero_grad_between_calls_and_parameters_of_a_closure():
    """A model's parameter (read from the closure, not an argument), an optimizer's
    ``zero_grad()`` (set to None) between calls, and a step whose backward adds to the
    gradient: every call's gradient is that batch's alone, and the optimizer steps on it."""
    model = _Boxes()
    loss_fn = ember.compile(ragged_giou_loss)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(r):
        loss = loss_fn(model.pred, r)
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step)
    for i, n in enumerate(BOXES):
        opt.zero_grad()
        r = _batch(i, n)
        before = model.pred.detach().clone()
        graphed(r)
        expected = _expected_grad(before, r)
        assert model.pred.grad is not None
        _close(model.pred.grad, expected)
        opt.step()
        torch.testing.assert_close(model.pred.detach().double(), before.double() - 0.1 * expected)
    assert graphed.exact_reason is None and len(graphed.captures) == 2


@gpu
def test_gradients_accumulate_across_calls_as_in_eager():
    """No zeroing at all: each call adds its batch's gradient, whichever capture runs. A new
    capture's warm-up run adds one more (a documented side effect), except on the first call,
    whose backward starts from no gradient and so starts the graph's buffer from zero."""
    pred = _pred().requires_grad_()
    loss_fn = ember.compile(ragged_giou_loss)

    def step(p, r):
        loss = loss_fn(p, r)
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step, warmup=1)
    total = torch.zeros_like(pred, dtype=torch.float64)
    for i, n in enumerate(BOXES):
        r = _batch(i, n)
        new_capture = capacity_for(n) not in _capacities(graphed)
        first_call = pred.grad is None
        graphed(pred, r)
        total += _expected_grad(pred, r) * (2 if new_capture and not first_call else 1)
        _close(pred.grad, total)
    assert graphed.exact_reason is None and len(graphed.captures) == 2


def _capacities(step) -> set[int]:
    return {c for entry in step.captures.values() for c in entry.capacities.values()}


@gpu
def test_ragged_values_gradients_are_each_calls_own():
    """A step that never resets its ragged values' gradient (each call's values are new leaves,
    as in eager): every call's ``values.grad`` is that batch's alone, not added to the warm-ups'
    or an earlier replay's."""
    w = torch.randn(16, device="cuda", requires_grad=True)
    f = ember.compile(lambda w, r: (torch.tanh(r.values) * w).sum())

    def step(w, r):
        w.grad = None
        loss = f(w, r)
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (whether T is read on the device is not this test's point)
        for n in (40, 100, 40, 100, 40):
            values = torch.randn(n, 16, device="cuda", requires_grad=True)
            graphed(w, Ragged(values, torch.tensor([0, n // 2, n], device="cuda")))
            ref_w, ref_values = w.detach().clone().requires_grad_(), values.detach().clone().requires_grad_()
            (torch.tanh(ref_values) * ref_w).sum().backward()
            torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(values.grad, ref_values.grad, rtol=1e-4, atol=1e-4)
