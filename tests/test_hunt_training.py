"""Training losses against eager at their edges: nll_loss's gradient where a class-weighted mean
divides by a total weight of 0 (eager's gradient is NaN at the targets only) and the sign of the
zeros around the targets; huber_loss's backward of mixed dtypes, which eager's kernel refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_same


def _exactly(out: torch.Tensor, ref: torch.Tensor) -> None:
    """The same values, NaN at the same places and zeros of the same sign (a NaN's sign is
    no value's)."""
    assert_same(out, ref)
    assert torch.equal(out.isnan(), ref.isnan()), f"NaN at other places:\n{out}\n{ref}"
    numbers = ~ref.isnan()
    assert torch.equal(out.signbit()[numbers], ref.signbit()[numbers]), f"signs differ:\n{out}\n{ref}"


_WEIGHT = [0.0, 1.0, 2.0, 0.0, 1.0]  # classes 0 and 3 weigh 0


@pytest.mark.parametrize("case", [
    # a weighted mean whose targets all weigh 0: total_weight 0, the loss NaN; eager's gradient is
    # NaN at each row's target and 0 elsewhere (torch's decomposition made every entry NaN)
    ("mean_all_targets_weigh_0", (4, 5), [0, 3, 0, 3], dict(weight=True)),
    ("mean_all_targets_weigh_0_2d", (2, 5, 3), [[0, 3, 0], [3, 3, 0]], dict(weight=True)),
    ("mean_all_targets_weigh_0_no_batch", (5,), 3, dict(weight=True)),
    # a negative incoming gradient: the entries off the targets (and an ignored row's) are 0.0 in
    # eager, where a one-hot times the gradient made them -0.0
    ("none_negative_gradient", (4, 5), [0, 2, 1, 3], dict(reduction="none", ignore_index=2)),
    ("none_negative_gradient_2d", (2, 5, 3), [[0, 4, 1], [4, 2, 3]], dict(reduction="none", ignore_index=4)),
    ("sum_negative_gradient_weighted", (4, 5), [0, 2, 1, 4], dict(reduction="sum", weight=True, ignore_index=2)),
    ("no_batch_ignored", (5,), 3, dict(ignore_index=3)),
], ids=lambda c: c[0])
def test_nll_loss_gradient_is_eagers_at_and_off_the_targets(case):
    _, shape, target, options = case
    options = dict(options)
    if options.pop("weight", False):
        options["weight"] = torch.tensor(_WEIGHT, device=DEVICE)
    target = torch.tensor(target, device=DEVICE)

    def loss(x, t):
        return F.nll_loss(x, t, **options)

    x = torch.randn(shape, device=DEVICE)
    results = []
    for fn in (ember.compile(loss), loss):
        x_ = x.clone().requires_grad_()
        out = fn(x_, target)
        out.backward(-torch.linspace(0.5, 1.0, out.numel(), device=DEVICE).reshape(out.shape))
        results.append((out.detach(), x_.grad))
    (out, grad), (out_ref, grad_ref) = results
    _exactly(out, out_ref)
    _exactly(grad, grad_ref)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_over_no_classes_raises_eagers_index_error_in_training(reduction):
    # The gradient-in-forward plan runs the backward's chain next to the loss: torch's one-hot
    # scatter into 0 classes ran as ATen ahead of the loss's kernel, a RuntimeError where eager's
    # bounds check raises IndexError
    if DEVICE != "cpu":
        pytest.skip("eager's CUDA kernel asserts on the device, which poisons the context for later tests")
    x = torch.randn(3, 0, device=DEVICE, requires_grad=True)
    target = torch.zeros(3, dtype=torch.long, device=DEVICE)

    def loss(x, t):
        return F.cross_entropy(x, t, reduction=reduction)

    with pytest.raises(IndexError):
        loss(x, target)
    with pytest.raises(IndexError):
        ember.compile(loss)(x, target)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtypes", [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_huber_loss_of_mixed_dtypes_raises_eagers_error_in_the_backward(dtypes, reduction):
    # eager computes the forward and its backward kernel refuses the mix; ember's decomposition
    # computed a gradient
    x = torch.rand(6, dtype=dtypes[0], device=DEVICE, requires_grad=True)
    target = torch.rand(6, dtype=dtypes[1], device=DEVICE)

    def loss(x, t):
        return F.huber_loss(x, t, reduction=reduction)

    with pytest.raises(RuntimeError, match="Found dtype") as eager_error:
        loss(x, target).sum().backward()
    out = ember.compile(loss)(x, target)
    assert_same(out, loss(x, target))
    with pytest.raises(RuntimeError, match="Found dtype") as ember_error:
        out.sum().backward()
    assert str(ember_error.value) == str(eager_error.value)
