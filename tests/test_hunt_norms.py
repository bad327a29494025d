"""Normalization layers against eager: BatchNorm's running statistics over several training
steps, then evaluation; its statistics of data with a large mean and a small spread, and of a
channel holding inf; the errors eager raises for running statistics given by halves; group norm
over empty inputs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_same


@pytest.mark.parametrize("case", [
    ("2d", dict()),
    ("2d_channels_last", dict(affine=False)),
    ("3d_channels_last", dict(track_running_stats=False)),
    ("1d_float64", dict(momentum=0.3, eps=1e-3)),
], ids=lambda c: c[0])
def test_batch_norm_modules_update_their_statistics_as_eager_over_steps(case):
    name, options = case
    dtype = torch.float64 if "float64" in name else torch.float32
    shape, make = {"1d": ((6, 5, 7), torch.nn.BatchNorm1d), "2d": ((4, 5, 6, 3), torch.nn.BatchNorm2d),
                   "3d": ((2, 5, 4, 3, 3), torch.nn.BatchNorm3d)}[name[:2]]
    ref = make(5, **options).to(DEVICE, dtype)
    if ref.affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
    model = copy.deepcopy(ref)
    compiled = ember.compile(model)
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape), torch.contiguous_format)
    for step, training in enumerate((True, True, True, False)):
        ref.train(training)
        model.train(training)
        x = (torch.randn(shape, device=DEVICE, dtype=dtype) * 2 + 0.5)
        if "channels_last" in name:
            x = x.contiguous(memory_format=layout)
        g = torch.randn(shape, device=DEVICE, dtype=dtype)
        x_ref, x_ember = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_ref, out = ref(x_ref), compiled(x_ember)
        grads_ref = torch.autograd.grad(out_ref, [x_ref, *ref.parameters()], g)
        grads = torch.autograd.grad(out, [x_ember, *model.parameters()], g)
        try:
            assert_same(out, out_ref)
            assert out.stride() == out_ref.stride()
            assert_same(list(grads), list(grads_ref), rtol=1e-4, atol=1e-5)
            # (running_mean, running_var and num_batches_tracked, exactly counted)
            assert_same(list(model.state_dict().values()), list(ref.state_dict().values()))
        except AssertionError as e:
            raise AssertionError(f"step {step} ({'training' if training else 'evaluation'}): {e}") from e


@pytest.mark.parametrize("mean, spread", [(1e4, 1e-2), (1e5, 1e-1)])
def test_batch_norm_statistics_of_a_large_mean_and_a_small_spread_keep_their_digits(mean, spread):
    # the variance of values near 1e4 spread by 1e-2, in float32: a one-pass or uncorrected
    # variance loses every digit (relative errors up to 5); eager's and ember's are near 1e-7
    x = (mean + torch.randn(16, 4, 8, 8, device=DEVICE, dtype=torch.float64) * spread).float()

    def step(x, rm, rv):
        return F.batch_norm(x, rm, rv, training=True, momentum=0.5), rm, rv

    def stats(dtype):
        return (torch.zeros(4, device=DEVICE, dtype=dtype), torch.ones(4, device=DEVICE, dtype=dtype))

    exact = step(x.double(), *stats(torch.float64))
    ours = ember.compile(step)(x, *stats(torch.float32))
    theirs = step(x, *stats(torch.float32))
    for i, what in ((1, "running_mean"), (2, "running_var")):
        error = ((ours[i].double() - exact[i]) / exact[i]).abs().max().item()
        eager_error = ((theirs[i].double() - exact[i]) / exact[i]).abs().max().item()
        assert error <= max(2 * eager_error, 1e-6), (what, error, eager_error)
    # the normalized values are off by the mean's rounding to float32 (ulp 1e-3 at 1e4) over the
    # spread, in ember and in eager alike
    assert (ours[0].double() - exact[0]).abs().max().item() < 0.1


def test_batch_norm_of_a_constant_channel_normalizes_it_to_its_bias():
    # variance 0: x - mean is exactly 0 (the corrected mean is x itself), so the output is the
    # bias and the weight's gradient 0, as in float64 (eager's CPU kernel gives 1e-4 of noise)
    x = torch.full((64, 3), 7.1, device=DEVICE)
    x[:, 1] = 3.25
    w = torch.rand(3, device=DEVICE, requires_grad=True)
    b = torch.randn(3, device=DEVICE, requires_grad=True)
    out = ember.compile(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True))(x, w, b)
    assert torch.equal(out, b.detach().expand(64, 3)), out[0] - b
    grad_w, = torch.autograd.grad(out, w, torch.randn(64, 3, device=DEVICE))
    assert torch.equal(grad_w, torch.zeros(3, device=DEVICE)), grad_w


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's CUDA mean of an inf is inf or NaN by layout")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 3), (4, 3, 5, 2)], ids=["1d", "2d"])
@pytest.mark.parametrize("value", [float("inf"), -float("inf"), float("nan")], ids=["inf", "neg_inf", "nan"])
def test_batch_norm_of_an_infinite_channel_keeps_eagers_running_mean(value, shape, dtype):
    # eager's CPU mean is sum / n: inf for a channel holding inf, where var_mean's corrected
    # mean (inf - inf) gave NaN; the variance, saved rstd and output are NaN in both
    def step(x, rm, rv, w, b, g):
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1)
        return (y, rm, rv, *torch.autograd.grad(y, (x, w, b), g))

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    x[2, 0] = value
    g = torch.randn(shape, generator=gen).to(dtype)
    w, b = torch.rand(3, generator=gen).to(dtype) + 0.5, torch.randn(3, generator=gen).to(dtype)

    def args():
        return (x.clone().requires_grad_(), torch.zeros(3, dtype=dtype), torch.ones(3, dtype=dtype),
                w.clone().requires_grad_(), b.clone().requires_grad_(), g)

    ref, out = step(*args()), ember.compile(step)(*args())
    assert_same(out, ref)  # (inf and NaN differ: equal_nan matches NaN to NaN only)

    def saved(x, w, b):  # (the mean and rstd autograd saves)
        return torch.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)

    assert_same(ember.compile(saved)(x, w, b), saved(x, w, b))


@pytest.mark.parametrize("training", [True, False], ids=["training", "evaluation"])
@pytest.mark.parametrize("given", ["running_mean", "running_var"])
def test_batch_norm_with_one_running_statistic_raises_eagers_error(training, given):
    # torch's decomposition of native_batch_norm raised RuntimeError in training too, where
    # eager's kernel raises ValueError ("... must either both be None or neither be None")
    stat = torch.ones(3, device=DEVICE)
    stats = (stat, None) if given == "running_mean" else (None, stat)

    def fn(x):
        return F.batch_norm(x, *stats, training=training)

    x = torch.randn(4, 3, 2, device=DEVICE)
    expected = ValueError if training else RuntimeError
    with pytest.raises(expected) as eager:
        fn(x)
    assert type(eager.value) is expected
    with pytest.raises(expected) as ours:
        ember.compile(fn)(x)
    assert type(ours.value) is expected, ours.value


@pytest.mark.parametrize("shape, groups", [((0, 4, 3), 2), ((2, 4, 0), 2), ((2, 0, 3), 1)],
                         ids=["no_samples", "no_pixels", "no_channels"])
def test_group_norm_over_an_empty_input_warns_no_more_than_eager(shape, groups):
    # the decomposition's var_mean over groups of no elements warned "degrees of freedom is
    # <= 0", which eager's group norm does not
    w = torch.randn(shape[1], device=DEVICE, requires_grad=True)
    b = torch.randn(shape[1], device=DEVICE, requires_grad=True)

    def fn(x, w, b):
        return F.group_norm(x, groups, w, b)

    x = torch.randn(shape, device=DEVICE, requires_grad=True)
    g = torch.randn(shape, device=DEVICE)
    if DEVICE == "cuda" and shape[1] == 0:
        # eager's CUDA kernel launches an empty grid there ("invalid argument"); ember's call
        # reaches the same ATen kernel and raises the same
        with pytest.raises(torch.AcceleratorError):
            fn(x, w, b)
        with pytest.raises(torch.AcceleratorError):
            ember.compile(fn)(x, w, b)
        return
    results = []
    for run in (fn, ember.compile(fn)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = run(x, w, b)
        results.append([out, *torch.autograd.grad(out, (x, w, b), g)])
    torch.testing.assert_close(results[1], results[0], equal_nan=True)
