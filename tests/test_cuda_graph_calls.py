"""Calls of an ``ember.cuda_graph`` step: the last call's arguments again skip the capture key,
and parameters' gradients follow eager's rules (each capture writes its own gradient buffers, so
a call must hand on the buffer of the capture that ran, and a gradient the caller set to None,
``zero_grad()``, must start from zero)."""

from __future__ import annotations

import copy
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


# ---- training loops as users write them, against eager (GPU) ---------------------------------

class _Block(torch.nn.Module):
    def __init__(self, d: int = 64, batchnorm: bool = False, dropout: float = 0.0):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.ln = torch.nn.LayerNorm(2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)
        self.bn = torch.nn.BatchNorm1d(d) if batchnorm else None
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.ln(self.fc1(x)))
        h = torch.nn.functional.dropout(h, self.dropout, self.training) if self.dropout else h
        y = self.fc2(h)
        return self.bn(y) if self.bn is not None else y


def _dense_batches(n: int, rows: int = 32, d: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, d, generator=g).cuda(), torch.randn(rows, d, generator=g).cuda()) for _ in range(n)]


def _trained_pair(make_opt):
    """A model compiled by ember, its eager twin, and an optimizer for each."""
    model = _Block().cuda()
    ref = copy.deepcopy(model)
    return model, ref, make_opt(model.parameters()), make_opt(ref.parameters()), ember.compile(model)


def _same_grads(model: torch.nn.Module, ref: torch.nn.Module) -> None:
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def _same_state(model: torch.nn.Module, ref: torch.nn.Module, tol: float = 2e-4) -> None:
    for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


@gpu
@pytest.mark.parametrize("make_opt", [lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                                      lambda p: torch.optim.Adam(p, lr=1e-3, capturable=True)],
                         ids=["sgd-momentum", "adam-capturable"])
def test_an_optimizer_step_inside_the_step(make_opt):
    """zero_grad, forward, backward and the optimizer's update all in the graph: the model after
    the calls is eager's after the same steps (plus the capture's one warm-up step)."""
    model, ref, opt, ref_opt, forward = _trained_pair(make_opt)

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        return loss

    graphed = ember.cuda_graph(step, warmup=1)
    data = _dense_batches(5)
    for x, y in [data[0], *data]:  # the warm-up is one more step on the first batch
        ref_opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for x, y in data:
        graphed(x, y)
    _same_state(model, ref)


@gpu
@pytest.mark.parametrize("set_to_none", [True, False])
def test_an_optimizer_outside_the_step(set_to_none):
    """The graph computes loss and gradients; zero_grad and AdamW's step run outside it."""
    model, ref, opt, ref_opt, forward = _trained_pair(lambda p: torch.optim.AdamW(p, lr=1e-3))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(forward(x), y)
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step)
    for x, y in _dense_batches(5):
        opt.zero_grad(set_to_none=set_to_none)
        ref_opt.zero_grad(set_to_none=set_to_none)
        loss = graphed(x, y)
        ref_loss = torch.nn.functional.mse_loss(ref(x), y)
        ref_loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
        _same_grads(model, ref)
        opt.step()
        ref_opt.step()
    _same_state(model, ref)


@gpu
def test_gradients_accumulate_over_micro_batches():
    model, ref, opt, ref_opt, forward = _trained_pair(lambda p: torch.optim.SGD(p, lr=0.1))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(forward(x), y) / 2
        loss.backward()
        return loss

    graphed = ember.cuda_graph(step)
    data = _dense_batches(8)
    for i in range(0, len(data), 2):
        opt.zero_grad()
        ref_opt.zero_grad()
        for x, y in data[i:i + 2]:
            graphed(x, y)
            (torch.nn.functional.mse_loss(ref(x), y) / 2).backward()
        _same_grads(model, ref)
        opt.step()
        ref_opt.step()
    _same_state(model, ref)


@gpu
def test_batchnorm_statistics_and_dropout_masks_per_replay():
    """A training-mode forward under no_grad: BatchNorm's running statistics are updated by every
    replay as by eager calls; dropout draws a new mask each replay."""
    model = _Block(batchnorm=True).cuda()
    ref = copy.deepcopy(model)
    forward = ember.compile(model)
    graphed = ember.cuda_graph(lambda x: forward(x), warmup=1)
    data = _dense_batches(4)
    with torch.no_grad():
        ref(data[0][0])  # the warm-up's update
        for x, _ in data:
            torch.testing.assert_close(graphed(x), ref(x), rtol=1e-4, atol=1e-4)
    _same_state(model, ref, 1e-4)

    dropped = ember.compile(_Block(dropout=0.5).cuda())
    graphed = ember.cuda_graph(lambda x: dropped(x))
    x = torch.randn(256, 64, device="cuda")
    with torch.no_grad():
        first = graphed(x).clone()
        assert not torch.equal(first, graphed(x))


@gpu
def test_autocast_and_pytree_outputs():
    model = _Block().cuda()
    ref = copy.deepcopy(model)
    forward = ember.compile(model)

    def step(x, y):
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = forward(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        return {"loss": loss, "rows": (out.amax(-1), out.float().softmax(-1))}

    graphed = ember.cuda_graph(step)
    for x, y in _dense_batches(3):
        got = graphed(x, y)
        for p in ref.parameters():
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = ref(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        torch.testing.assert_close(got["loss"], loss, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got["rows"][0], out.amax(-1), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got["rows"][1], out.float().softmax(-1), rtol=2e-2, atol=2e-2)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=5e-2, atol=5e-3)


@gpu
def test_an_error_in_the_first_call_then_good_calls_and_strided_arguments():
    f = ember.compile(lambda x, w: (x @ w).relu())
    graphed = ember.cuda_graph(f)
    x = torch.randn(8, 4, device="cuda")
    with pytest.raises(RuntimeError, match="reduction dim|size mismatch|shapes cannot be multiplied"):
        graphed(x, torch.randn(5, 3, device="cuda"))
    w = torch.randn(4, 3, device="cuda")
    torch.testing.assert_close(graphed(x, w), (x @ w).relu())

    g = ember.compile(lambda x: torch.tanh(x) * 2)
    base = torch.randn(64, 32, device="cuda")
    in_place, copied = ember.cuda_graph(g, static_args=(0,)), ember.cuda_graph(g)
    view = base.t()[:, 1:]  # read where it is: the graph sees each call's contents
    for _ in range(2):
        base.normal_()
        torch.testing.assert_close(in_place(view), torch.tanh(view) * 2)
        torch.testing.assert_close(copied(base.t()), torch.tanh(base.t()) * 2)
        torch.testing.assert_close(copied(base[:, ::2]), torch.tanh(base[:, ::2]) * 2)
