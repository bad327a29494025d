"""Compiled code under autograd's modes and transforms (forward-mode AD, grad modes, autocast,
hooks), compared with eager PyTorch."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

import ember

from .helpers import assert_same


@pytest.mark.parametrize("requires_grad", [False, True])
def test_forward_mode_ad_through_a_compiled_function_matches_eager(requires_grad):
    # Dynamo does not guard on tangents: the graph compiled for plain tensors was called with
    # dual ones, and ember's kernels dropped the tangent (sin's came back None), or kept only an
    # ATen matmul's part of it (a wrong jvp); a training graph raised AOTAutograd's "implement
    # the jvp function" where eager computes
    def fn(x, w):
        return (x @ w).tanh() * x + x.sin()

    torch.manual_seed(0)
    x, t = torch.randn(4, 4), torch.randn(4, 4)
    w = torch.randn(4, 4, requires_grad=requires_grad)
    compiled = ember.compile(fn)
    assert_same(compiled(x, w), fn(x, w))  # compiled for plain tensors first
    results = []
    for run in (fn, compiled):
        with forward_ad.dual_level(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = run(forward_ad.make_dual(x, t), w)
            primal, tangent = forward_ad.unpack_dual(out)
            results.append((primal.detach(), tangent))
    assert results[1][1] is not None
    assert_same(results[1], results[0])
    with forward_ad.dual_level():  # plain inputs under a dual level: the compiled program
        assert_same(compiled(x, w), fn(x, w))


def test_inference_tensor_inputs_of_a_training_graph_are_refused_only_where_eager_refuses():
    # a teacher's logits made under inference_mode, weighting a per-row loss: eager's mul saves
    # sigmoid(t), a tensor of its own; AOTAutograd's partitioner recomputes it from t, saved
    # itself, and autograd refused it ("Inference tensors cannot be saved for backward") where
    # eager computes
    def loss(s, t):
        return ((s - t) ** 2 * t.sigmoid()).sum(-1)

    torch.manual_seed(0)
    with torch.inference_mode():
        teachers = [torch.randn(6, 5), torch.randn(6, 1).expand(6, 5)]
    compiled = ember.compile(loss)
    for t in teachers:  # (and expanded: the program reads the copy with the input's strides)
        results = []
        for run in (loss, compiled):
            s = torch.linspace(-2, 2, 30).reshape(6, 5).requires_grad_()
            out = run(s, t)
            out.backward(torch.ones(6))
            results.append((out.detach(), s.grad))
        assert_same(results[1], results[0])
    # an op saving the inference tensor itself: eager's autograd refuses, and so does ember
    w = torch.ones(6, 5, requires_grad=True)
    for run in (lambda a, b: a * b, ember.compile(lambda a, b: a * b)):
        with warnings.catch_warnings(), pytest.raises(RuntimeError, match="Inference tensors cannot be saved"):
            warnings.simplefilter("ignore", RuntimeWarning)
            run(teachers[0], w)


def test_training_graph_writing_an_inference_tensor_in_place_raises_eagers_error():
    # a BatchNorm built under inference_mode, then trained: eager refuses the update of its
    # running statistics; the compiled training graph wrote a normal copy of each buffer, the
    # update lost without an error (and so with only one buffer made under inference_mode)
    def made_under_inference_mode() -> torch.nn.Module:
        with torch.inference_mode():
            return torch.nn.BatchNorm1d(3)

    def one_buffer_under_inference_mode() -> torch.nn.Module:
        m = torch.nn.BatchNorm1d(3)
        with torch.inference_mode():
            m.num_batches_tracked = torch.zeros((), dtype=torch.long)
        return m

    x = torch.randn(5, 3)
    for make in (made_under_inference_mode, one_buffer_under_inference_mode):
        for run in (make(), ember.compile(make())):
            with warnings.catch_warnings(), pytest.raises(RuntimeError, match="Inplace update to inference tensor"):
                warnings.simplefilter("ignore", RuntimeWarning)
                run(x)


def test_batched_gradients_through_a_compiled_backward_match_eager():
    # autograd.grad(..., is_grads_batched=True) and jacobian(..., vectorize=True) call the
    # backward under torch's vmap, with batched gradients: ember's kernels read their memory,
    # which they have none of ("Cannot access data pointer"), where eager and aot_eager compute.
    # Compiled twice: the second compile loads the graphs from torch's AOTAutograd cache.
    from torch._dynamo.utils import counters

    def fn(x, w):
        return torch.tanh(x @ w).sin() * x.sum(-1, keepdim=True)

    x = torch.linspace(-1, 1, 6).reshape(2, 3)
    w = torch.linspace(0.5, 1.5, 12).reshape(3, 4)
    eye = torch.eye(8).reshape(8, 2, 4)

    def batched(run):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        return torch.autograd.grad(run(xs, ws), (xs, ws), eye, is_grads_batched=True)

    expected = [batched(fn), torch.autograd.functional.jacobian(fn, (x, w), vectorize=True)]
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        compiled = ember.compile(fn)
        assert_same([batched(compiled), torch.autograd.functional.jacobian(compiled, (x, w), vectorize=True)],
                    expected)
    assert counters["aot_autograd"]["autograd_cache_hit"] >= 1 or not ember.aot_cache.SUPPORTED


def test_an_input_written_under_no_grad_after_its_use_keeps_the_values_the_backward_needs():
    # an update of a weight under no_grad after the forward used it (a codebook's step): eager's
    # backward reads exp's result (sin's input) and x; min-cut saved w to recompute them in the
    # backward, and the write copied into w after the forward made autograd raise "modified by an
    # inplace operation" where eager computes. Where eager's backward reads the written input
    # itself (w * w), both raise.
    def used_then_written(w, x):
        y = (w * x).exp().sum()
        with torch.no_grad():
            w.mul_(2)
        return y

    def viewed_then_written(w, x):
        y = (w.view(2, 2) * x.view(2, 2)).sin()
        with torch.no_grad():
            w.add_(1)
        return y

    def read_by_the_backward(w, x):
        y = (w * w).sin().sum()
        with torch.no_grad():
            w.add_(1)
        return y

    for fn in (used_then_written, viewed_then_written, read_by_the_backward):
        results = []
        for run in (fn, ember.compile(fn)):
            w = torch.linspace(-1, 1, 4).requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                y = run(w, torch.full((4,), 0.5))
            try:
                y.backward(torch.ones_like(y))
                results.append((y.detach(), w.detach(), w.grad))
            except RuntimeError as e:
                assert "modified by an inplace operation" in str(e)
                results.append("raised")
        assert results[0] != "raised" or results[1] == "raised"
        assert_same(results[1], results[0])


def test_a_leaf_written_under_no_grad_keeps_a_none_grad():
    # a target network's soft update (p.lerp_(q, tau) under no_grad) in a compiled training step:
    # the backward passed the update's (zero) tangent back to the target's leaf, whose .grad
    # became zeros where eager leaves None (an optimizer holding it then moved it: momentum,
    # weight decay). A leaf also feeding the loss keeps its gradient; a non-leaf written under
    # no_grad still passes later uses' gradient back to its own graph.
    def soft_update(online, target, x):
        with torch.no_grad():
            target.lerp_(online, 0.25)
        return (online * x).sum()

    def used_and_updated(online, target, x):
        y = (online * x + target * x).sum()  # (saves no input: the write is allowed)
        with torch.no_grad():
            target.lerp_(online, 0.25)
        return y

    for fn in (soft_update, used_and_updated):
        results = []
        for run in (fn, ember.compile(fn)):
            online, target = torch.linspace(-1, 1, 5).requires_grad_(), torch.linspace(2, 3, 5).requires_grad_()
            run(online, target, torch.full((5,), 0.5)).backward()
            results.append((target.detach(), online.grad, target.grad))
        assert (results[1][2] is None) == (results[0][2] is None), fn.__name__
        assert_same(results[1], results[0])

    results = []
    for run in (soft_update, ember.compile(soft_update)):
        online, base = torch.linspace(-1, 1, 5).requires_grad_(), torch.linspace(2, 3, 5).requires_grad_()
        target = base * 2
        run(online, target, torch.full((5,), 0.5))
        (target * torch.arange(5.0)).sum().backward()  # through the written non-leaf, to base
        results.append((target.detach(), online.grad, base.grad))
    assert_same(results[1], results[0])
