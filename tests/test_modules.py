"""Normalization and dropout layers, compiled, against eager: their values, their running
statistics and the errors eager raises."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same


@pytest.mark.parametrize("fn, dtype", [
    (lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3), training=True), torch.int64),
    (lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3), training=False), torch.bool),
    (lambda x: F.group_norm(x, 3), torch.int32),
    (lambda x: F.layer_norm(x, (4,)), torch.bool),
    (lambda x: F.instance_norm(x), torch.int64),
    (lambda x: F.layer_norm(x, (4,)), torch.complex64),
    (lambda x: F.batch_norm(x, None, None, training=True), torch.complex64),
    (lambda x: F.group_norm(x, 1), torch.complex64),
    (torch.nn.BatchNorm1d(3), torch.int64),
], ids=["batch_int", "batch_eval_bool", "group_int32", "layer_bool", "instance_int", "layer_complex",
        "batch_complex", "group_complex", "module_int"])
def test_norms_of_inputs_eager_has_no_kernel_for_raise_its_error(fn, dtype):
    # torch's references refused integers and bools with a RuntimeError (a mean of integers); the
    # decompositions computed complex batch and group norms
    x = torch.arange(24).reshape(2, 3, 4).to(dtype)
    with pytest.raises(NotImplementedError):
        fn(x)
    with pytest.raises(NotImplementedError, match="(?i)norm"):
        ember.compile(fn)(x)


def test_instance_norm_with_running_statistics_compiles_without_aten_calls():
    # its weight and running statistics are repeated per sample (aten.repeat, by the batch size:
    # symbolic here), which ran through ATen
    torch.manual_seed(0)
    model = torch.nn.InstanceNorm2d(5, affine=True, track_running_stats=True)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
        model.bias.uniform_(-1, 1)
    compiled_model = copy.deepcopy(model)
    report = ember.Report()
    compiled = ember.compile(compiled_model, dynamic=True, report=report)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 5, 4, 3)
        assert_same(compiled(x), model(x))
    for name, value in model.state_dict().items():
        assert_same(compiled_model.state_dict()[name], value)
    model.eval()
    compiled_model.eval()
    x = torch.randn(3, 5, 4, 3)
    assert_same(compiled(x), model(x))
    assert report.fallbacks == []


def test_group_norm_gradients_over_symbolic_sizes_compile_without_aten_calls():
    # its backward's 1 / (H*W*C/G), float arithmetic on sizes, reaches ember as 0-d tensors
    # divided by aten.true_divide (torch's pass that tensorifies float sizes), which ran through ATen
    torch.manual_seed(0)
    model = torch.nn.GroupNorm(2, 6)
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
    compiled_model = copy.deepcopy(model)
    report = ember.Report()
    compiled = ember.compile(compiled_model, dynamic=True, report=report)
    for batch, height in ((2, 4), (3, 5)):
        x = torch.randn(batch, 6, height, 3)
        x_ref, x_ember = x.clone().requires_grad_(), x.clone().requires_grad_()
        grad = torch.randn(batch, 6, height, 3)
        model(x_ref).backward(grad)
        compiled(x_ember).backward(grad)
        assert_same(x_ember.grad, x_ref.grad)
    assert_same([p.grad for p in compiled_model.parameters()], [p.grad for p in model.parameters()])
    assert report.fallbacks == []


@pytest.mark.parametrize("padding, shape", [((1, 2), (2, 3, 4)), ((2, 0, -1, 1), (2, 3, 4, 5))])
def test_circular_padding_compiles_without_aten_calls(padding, shape):
    # its decomposition fills a torch.empty slice by slice: the empty ran through ATen
    x = torch.randn(shape)
    report = ember.Report()
    out = ember.compile(lambda x: F.pad(x, padding, mode="circular"), report=report)(x)
    assert_same(out, F.pad(x, padding, mode="circular"))
    assert report.fallbacks == []


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3)), (5, 4)),
    (lambda: torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3), dim=1), (5, 4)),
    (lambda: torch.nn.utils.weight_norm(torch.nn.Conv1d(2, 3, 3)), (2, 2, 6)),
], ids=["first_dim", "last_dim", "old_api_conv"])
@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")
def test_weight_norm_trains_like_eager_without_aten_calls(make, shape):
    # torch has no decomposition of the norm's backward (_weight_norm_interface_backward): it
    # ran through ATen in every training step
    torch.manual_seed(0)
    model = make()
    torch.manual_seed(0)
    compiled_model = make()
    report = ember.Report()
    compiled = ember.compile(compiled_model, report=report)
    x = torch.randn(shape)
    for _ in range(2):
        results = []
        for run, m in ((model, model), (compiled, compiled_model)):
            out = run(x)
            out.square().sum().backward()
            results.append((out, *(p.grad for p in m.parameters())))
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.1 * p.grad
            m.zero_grad()
        assert_same(results[1], results[0])
    assert not [f for f in report.fallbacks if "weight_norm" in f]
