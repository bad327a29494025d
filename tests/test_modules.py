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
