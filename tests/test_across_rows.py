"""Reductions over a row kernel's rows (rowreduce values): a loss's mean over per-row values is
finished by the row kernel itself, each program's share combined by the last to finish, so a
cross-entropy is one kernel. Compared with eager on every backend, with the cases that must stay
apart (a row that needs the total) and awkward row counts."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check
from .test_cuda import compile_batches, needs_nvcc, sources

TARGETS = {
    "cpp": {"target": "cpp"},
    "triton": {"target": "triton"},
    "triton-looped": {"target": "triton", "triton_launch": {"PERSISTENT": False, "RBLOCK": 16}},
    "triton-4rows": {"target": "triton", "triton_launch": {"PERSISTENT": True, "XBLOCK": 4, "RBLOCK": 128}},
}


def cross_entropy(x, t):
    return F.cross_entropy(x, t)


def ce_inputs(rows, classes, dtype):
    t = torch.randint(0, classes, (rows,))
    t[::3] = -100  # ignored: the mean is over the others
    return torch.randn(rows, classes, dtype=dtype), t


CASES = {
    "cross_entropy": (cross_entropy, lambda dtype: ce_inputs(37, 100, dtype)),
    "cross_entropy_sum": (lambda x, t: F.cross_entropy(x, t, reduction="sum"), lambda dtype: ce_inputs(64, 30, dtype)),
    "max_of_logsumexp": (lambda x: x.logsumexp(-1).max(), lambda dtype: (torch.randn(45, 70, dtype=dtype),)),
    "mean_of_row_norms": (lambda x: x.pow(2).sum(-1).sqrt().mean(),
                          lambda dtype: (torch.randn(3, 11, 40, dtype=dtype),)),
    "any_row_large": (lambda x: (x.sum(-1) > 5).any(), lambda dtype: (torch.randn(50, 20, dtype=dtype),)),
}


def fused_kernel(report):
    (kernel,) = report.kernels
    assert "rowreduce" in kernel.kernel_ir, kernel.kernel_ir
    return kernel


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("name", list(CASES))
def test_reduction_over_rows_is_finished_by_the_row_kernel(name, target):
    torch.manual_seed(0)
    fn, make = CASES[name]
    for dtype in (torch.float32, torch.bfloat16):
        report = check(fn, *make(dtype), options=TARGETS[target])
        fused_kernel(report)


def test_cross_entropy_is_one_kernel_and_one_launch_on_cpu():
    torch.manual_seed(0)
    report = check(cross_entropy, *ce_inputs(64, 100, torch.float32), options={"target": "cpp"})
    kernel = fused_kernel(report)
    (rows,) = [line for line in kernel.source.splitlines() if "omp parallel for" in line]
    assert rows.count("reduction(+:") == 2  # the losses and the count, over the rows
    assert "// after every row" in kernel.source
    assert report.graphs[0].wrapper.count("fused_") == 1


def test_many_programs_count_their_shares_in_groups():
    """200 one-row programs: 4 groups of up to 64 count their shares, the last group's last
    program the groups (twice: the counters must be back at zero for the second launch)."""
    torch.manual_seed(0)
    options = {"target": "triton", "triton_launch": {"XBLOCK": 1, "RBLOCK": 32, "PERSISTENT": True}}
    compiled = ember.compile(cross_entropy, options=options)
    for _ in range(2):
        x, t = ce_inputs(200, 30, torch.float32)
        assert_same(compiled(x, t), cross_entropy(x, t))


def test_a_row_that_needs_the_total_keeps_it_apart():
    """y - y.mean(): every row needs the mean over rows, so it cannot wait for the last row."""
    torch.manual_seed(0)
    x = torch.randn(40, 30)
    for target in ("cpp", "triton"):
        report = check(lambda x: (lambda y: y - y.mean())(x.sum(-1)), x, options={"target": target})
        assert len(report.kernels) >= 2


@pytest.mark.parametrize("target", ["cpp", "triton"])
def test_symbolic_rows_and_no_rows(target):
    torch.manual_seed(0)
    compiled = ember.compile(cross_entropy, dynamic=True, options={"target": target})
    for rows in (40, 7, 130):
        x, t = ce_inputs(rows, 50, torch.float32)
        assert_same(compiled(x, t), cross_entropy(x, t))
    x = torch.randn(0, 50)  # the mean over no rows: 0 / 0, as eager
    assert_same(ember.compile(cross_entropy, options={"target": target})(x, torch.zeros(0, dtype=torch.long)),
                cross_entropy(x, torch.zeros(0, dtype=torch.long)))


def test_training_step_with_the_fused_loss():
    torch.manual_seed(0)
    x, t = ce_inputs(33, 70, torch.float32)
    for target in ("cpp", "triton"):
        a = x.clone().requires_grad_()
        loss = ember.compile(cross_entropy, options={"target": target})(a, t)
        loss.backward()
        b = x.clone().requires_grad_()
        cross_entropy(b, t).backward()
        assert_same((loss, a.grad), (cross_entropy(b, t), b.grad))


@needs_nvcc
def test_fused_cuda_kernels_compile_for_sm90(tmp_path):
    kernels = []
    for i, (fn, make) in enumerate(CASES.values()):
        for dtype in (torch.float32, torch.bfloat16):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = ember.explain(fn, *make(dtype), target="cuda")
            kernel = fused_kernel(report)
            assert "// strategy: rows" in kernel.source and "ember_last = atomicAdd(counter, 1)" in kernel.source
            kernels += sources(report, f"across{i}_{str(dtype)[6:]}")
    compile_batches(kernels, tmp_path, per_file=len(kernels))
