"""Losses at their edges (NaN, overflow, float16's epsilon, bad targets, weights that require
grad) give eager's values, gradients and errors, generated rather than run through ATen."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same


def _loss_and_grads(fn, args, grad_at):
    leaves = [a.detach().clone().requires_grad_(i in grad_at) for i, a in enumerate(args)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, [leaves[i] for i in grad_at], torch.full_like(out, 1.5))
    return [out.detach(), *grads]


def _same_as_eager(fn, args, grad_at):
    want = _loss_and_grads(fn, args, grad_at)
    report = ember.Report()
    got = _loss_and_grads(ember.compile(fn, report=report), args, grad_at)
    assert_same(got, want)
    return report


def test_smooth_l1_backward_is_generated_with_eager_nan_gradients():
    # torch's decomposition took sign(NaN) = 0 outside |x| < beta (a NaN difference's gradient
    # came out 0 where eager's is NaN), so the backward ran through ATen; it is eager's formula now
    x, y = torch.randn(9, 3), torch.randn(9, 3)
    x[[0, 4, 8], 1] = float("nan")
    x[1, 0], x[2, 0] = y[1, 0] + 0.5, y[2, 0] - 0.5  # exactly at +-beta
    report = _same_as_eager(lambda a, b: F.smooth_l1_loss(a, b, beta=0.5, reduction="none"), (x, y), (0, 1))
    assert not report.fallbacks, report.fallbacks


def test_soft_margin_backward_is_nan_where_eager_overflows():
    # eager's -t * z / (1 + z) with z = exp(-t * x) is NaN past |x| ~ 88 in float32 (the loss is
    # inf there); torch's sigmoid form gave those elements a gradient of +-1
    x = torch.tensor([[-100.0, -20.0, 0.0, 3.0], [100.0, 20.0, -12.0, 90.0]], dtype=torch.float32)
    t = torch.tensor([[1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, 1.0, -1.0]])
    for reduction in ("none", "mean"):
        _same_as_eager(lambda a, b, r=reduction: F.soft_margin_loss(a, b, reduction=r), (x, t), (0,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_binary_cross_entropy_gradient_at_0_and_1_uses_epsilon_of_the_dtype(dtype):
    # eager divides by max(x * (1 - x), 1e-12 in the input's dtype): 0 in float16, so an input of
    # exactly 0 or 1 has a NaN or infinite gradient; float32's 1e-12 had made them finite
    p = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5, 1e-3], dtype=dtype)
    t = torch.tensor([0.0, 1.0, 1.0, 0.0, 0.25, 0.0], dtype=dtype)
    _same_as_eager(lambda a, b: F.binary_cross_entropy(a, b, reduction="none"), (p, t), (0, 1))


def test_weighted_label_smoothed_cross_entropy_target_out_of_range_is_index_error():
    # the mean's weight sum gathers the class weights by target in the same kernel as nll_loss's
    # gather: its RuntimeError flag replaced nll_loss's IndexError, which eager raises first
    fn = lambda x, t, w: F.cross_entropy(x, t, weight=w, label_smoothing=0.1)  # noqa: E731
    x, t, w = torch.randn(6, 5), torch.tensor([0, 1, 9, 2, 3, -100]), torch.rand(5)
    with pytest.raises(IndexError):
        fn(x, t, w)
    with pytest.raises(IndexError, match="out of bounds"):
        ember.compile(fn)(x, t, w)


def test_multi_margin_loss_weight_requiring_grad_raises_as_eager():
    # eager's autograd has no formula for the class weights; ember's decomposition (installed at
    # the Autograd key) was differentiable in them and gave the weight a gradient
    fn = lambda x, t, w: F.multi_margin_loss(x, t, weight=w)  # noqa: E731
    x, t = torch.randn(4, 5, requires_grad=True), torch.tensor([0, 4, 2, 1])
    w = torch.rand(5, requires_grad=True)
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        fn(x, t, w)
    # (torch's trace fails on it and the graph runs eagerly: eager's error alone, no warning
    # blaming the compiler for a call eager refuses)
    with warnings.catch_warnings(record=True) as caught, \
            pytest.raises(RuntimeError, match="not differentiable with respect to argument 'weight'"):
        warnings.simplefilter("always")
        ember.compile(fn)(x, t, w)
    assert not [w for w in caught if str(w.message).startswith("ember")], [str(w.message) for w in caught]
    # (a weight that does not require grad still compiles, and matches eager)
    _same_as_eager(fn, (x, t, w.detach()), (0,))


def test_p_norms_of_other_orders_are_generated_with_eager_gradients():
    # linalg_vector_norm of orders but 0, 1, 2 and inf (triplet_margin_loss(p=3), F.normalize
    # with p=1.5) ran through ATen; it is sum(|x|^p)^(1/p) with the order rounded as eager's
    # kernel rounds it. A zero row and zero elements take eager's gradient (0, or NaN for p < 1)
    a, p, n = torch.randn(3, 6, 5).unbind(0)
    p[1] = a[1]  # a zero distance
    x = torch.randn(6, 5)
    x[0], x[2, 3] = 0.0, 0.0
    report = _same_as_eager(lambda a, p, n: F.triplet_margin_loss(a, p, n, p=3), (a, p, n), (0, 1, 2))
    assert not report.fallbacks, report.fallbacks
    # torch.dist, the norm of a broadcast difference, ran through ATen at every order
    report = _same_as_eager(lambda a, b: torch.dist(a, b, 3) + torch.dist(a, b[0], 0.5) + torch.dist(a, b),
                            (a, n.double()), (0, 1))
    assert not report.fallbacks, report.fallbacks
    # (one function each: Dynamo makes an order that changes between calls a symbolic input)
    for fn in (lambda x: F.normalize(x, p=1.5, dim=1).sum(1) ** 2, lambda x: F.normalize(x, p=0.5, dim=1).sum(1) ** 2,
               lambda x: F.normalize(x, p=-2, dim=1).sum(1) ** 2):
        report = _same_as_eager(fn, (x,), (0,))
        assert not report.fallbacks, report.fallbacks


@pytest.mark.parametrize("target_dtype", [torch.int64, torch.uint8])
@pytest.mark.parametrize("reduction", ["none", "sum"])
def test_binary_cross_entropy_with_logits_integer_target_raises_as_eager(target_dtype, reduction):
    # eager computes in the target's dtype ((1 - target).mul_(input)) and refuses an integer one;
    # the decomposition cast the loss to int64 and returned it (Bernoulli(logits).log_prob(ints))
    def loss(x, y):
        return F.binary_cross_entropy_with_logits(x, y, reduction=reduction)

    x, y = torch.randn(6), torch.tensor([1, 0, 1, 1, 0, 0], dtype=target_dtype)
    with pytest.raises(RuntimeError) as eager:
        loss(x, y)
    with pytest.raises(RuntimeError) as compiled:
        ember.compile(loss)(x, y)
    assert str(compiled.value) == str(eager.value)
    # a float target of another dtype than the input still decomposes, with eager's values
    assert_same(ember.compile(loss)(x, y.double()), loss(x, y.double()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mse_loss_gradient_over_no_elements_compiles(dtype):
    # torch's decomposition divides 2.0 by the element count in Python: a mean over an empty
    # ragged batch (a size 0, or a symbolic one hinted 0) raised ZeroDivisionError while tracing,
    # and the training graph ran eagerly with a warning
    from ember import ragged

    fn = lambda r, t: F.mse_loss(r.values, t)  # noqa: E731
    fast = ember.compile(fn, dynamic=True)
    for lengths in ([3, 4], [0, 0], [2], [0]):
        parts = ragged.from_list([torch.randn(n, 4, dtype=dtype) for n in lengths])
        t = torch.randn(parts.values.shape, dtype=dtype)
        got, want = ([], [])
        for f, out in ((fast, got), (fn, want)):
            v = parts.values.detach().clone().requires_grad_(True)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # (no "could not trace" fallback)
                loss = f(ragged.Ragged(v, parts.offsets), t)
                (g,) = torch.autograd.grad(loss, v, torch.tensor(1.5, dtype=dtype))
            out += [loss.detach(), g]
        assert_same(got, want)
    x = torch.randn(0, 3, requires_grad=True)
    (g,) = torch.autograd.grad(ember.compile(F.mse_loss)(x, torch.randn(0, 3)), x)
    assert g.shape == (0, 3)


def test_mse_loss_gradient_of_mixed_dtypes_keeps_the_op_where_the_cpu_kernel_refuses(monkeypatch):
    # torch 2.11's CPU kernel refuses the mix ("Found dtype Half but expected Float"): asked of
    # the kernel (here made to refuse), ember keeps the op for ATen, which answers as eager's
    from ember.frontend import decompositions

    monkeypatch.setattr(decompositions, "_cpu_mse_backward_refuses", lambda input_dtype, target_dtype: True)
    fn = lambda a, t: F.mse_loss(a * 3, t)  # noqa: E731
    report = ember.Report()
    x, target = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3).half()
    try:
        want = torch.autograd.grad(fn(x, target), x)
    except RuntimeError as e:  # (torch 2.11's kernel refuses it indeed)
        want = e
    compiled = ember.compile(fn, report=report)
    if isinstance(want, RuntimeError):
        with pytest.raises(RuntimeError, match=re.escape(str(want))):
            torch.autograd.grad(compiled(x, target), x)
    else:
        assert_same(torch.autograd.grad(compiled(x, target), x), want)
    assert "aten.mse_loss_backward" in report.fallbacks


@pytest.mark.parametrize("input_dtype,target_dtype", [(torch.float32, torch.float16),
                                                      (torch.bfloat16, torch.float32),
                                                      (torch.float16, torch.float64)])
def test_mse_loss_gradient_of_mixed_dtypes_is_eagers_on_the_cpu(input_dtype, target_dtype):
    # torch 2.13's CPU kernel takes an input and a target of different dtypes (its CUDA kernel refuses
    # them): computed in their common dtype, held in the input's. The op was kept for ATen, and
    # over no elements the trace took its shape from torch's decomposition, which divides by 0:
    # the graph ran eagerly with a warning
    fn = lambda x, t: F.mse_loss(x * 2, t)  # noqa: E731
    x = torch.ones(2, requires_grad=True, dtype=input_dtype)
    try:
        F.mse_loss(x, torch.ones(2, dtype=target_dtype)).backward()
    except RuntimeError as e:  # torch before 2.13: ember's gradient raises as eager's
        with pytest.raises(RuntimeError, match="Found dtype"):
            ember.compile(fn)(x, torch.ones(2, dtype=target_dtype)).backward()
        pytest.skip(f"this torch's CPU kernel refuses the mix too ({e})")
    fast = ember.compile(fn, dynamic=True)
    for rows in (5, 0, 3):
        x, t = torch.randn(rows, 7, dtype=input_dtype), torch.randn(rows, 7, dtype=target_dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = _loss_and_grads(fast, (x, t), [0])
        want = _loss_and_grads(fn, (x, t), [0])
        assert got[1].dtype == input_dtype
        assert_same(got, want, rtol=0, atol=0)
