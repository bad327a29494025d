"""Reductions over a row kernel's rows (rowreduce values): a loss's mean over per-row values is
finished by the row kernel itself, each program's share combined by the last to finish, so a
cross-entropy is one kernel. Compared with eager on every backend, with the cases that must stay
apart (a row that needs the total) and awkward row counts."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import INTERPRETED_TRITON
from .helpers import assert_same, check
from .test_cuda import compile_batches, needs_nvcc, sources

TARGETS = {
    "cpp": {"target": "cpp"},
    "triton": {"target": "triton"},
    "triton-looped": {"target": "triton", "triton_launch": {"PERSISTENT": False, "RBLOCK": 16}},
    "triton-4rows": {"target": "triton", "triton_launch": {"PERSISTENT": True, "XBLOCK": 4, "RBLOCK": 128}},
}



def _targets(*names: str) -> list:
    """Triton on CPU tensors runs in the interpreter, which only the CPU test run sets up."""
    return [pytest.param(n, marks=INTERPRETED_TRITON) if n.startswith("triton") else n for n in names]


def cross_entropy(x, t):
    return F.cross_entropy(x, t)


def ce_inputs(rows, classes, dtype):
    t = torch.randint(0, classes, (rows,))
    t[::3] = -100  # ignored: the mean is over the others
    return torch.randn(rows, classes, dtype=dtype), t


CASES = {
    "cross_entropy": (cross_entropy, lambda dtype: ce_inputs(37, 40, dtype)),
    "cross_entropy_sum": (lambda x, t: F.cross_entropy(x, t, reduction="sum"), lambda dtype: ce_inputs(64, 30, dtype)),
    "max_of_logsumexp": (lambda x: x.logsumexp(-1).max(), lambda dtype: (torch.randn(45, 40, dtype=dtype),)),
    "mean_of_row_norms": (lambda x: x.pow(2).sum(-1).sqrt().mean(),
                          lambda dtype: (torch.randn(3, 11, 40, dtype=dtype),)),
    "any_row_large": (lambda x: (x.sum(-1) > 5).any(), lambda dtype: (torch.randn(50, 20, dtype=dtype),)),
}


def fused_kernel(report):
    (kernel,) = report.kernels
    assert "rowreduce" in kernel.kernel_ir, kernel.kernel_ir
    return kernel


@pytest.mark.parametrize("target", _targets(*TARGETS))
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
    # the losses and the count over the rows: each thread's shares, combined in thread order
    assert kernel.source.count("#pragma omp for schedule(static) nowait") == 1
    assert kernel.source.count("_t[omp_get_thread_num()] = ") == 2
    assert "// after every row" in kernel.source
    assert report.graphs[0].wrapper.count("fused_") == 1


def test_many_programs_count_their_shares_in_groups(monkeypatch):
    """18 one-row programs: 3 groups of up to 8 (the last of 2) count their shares, the last
    group's last program the groups (twice: the counters must be back at zero for the second launch).
    (Groups of 8 here, not ROW_GROUP's 64, as the interpreter runs every program.)"""
    from ember.codegen import triton_loops
    from ember.runtime import triton_backend
    monkeypatch.setattr(triton_loops, "ROW_GROUP", 8)  # (the kernel's groups)
    monkeypatch.setattr(triton_backend, "ROW_GROUP", 8)  # (its workspace)
    torch.manual_seed(0)
    options = {"target": "triton", "triton_launch": {"XBLOCK": 1, "RBLOCK": 32, "PERSISTENT": True}}
    report = ember.Report()
    compiled = ember.compile(cross_entropy, options=options, report=report)
    for _ in range(2):
        x, t = ce_inputs(18, 30, torch.float32)
        assert_same(compiled(x, t), cross_entropy(x, t))
    assert "ngroups = tl.cdiv(nprog, 8)" in fused_kernel(report).source


@pytest.mark.parametrize("target", _targets("cpp", "triton"))
def test_a_row_that_needs_the_total_keeps_it_apart(target):
    """y - y.mean(): every row needs the mean over rows, so it cannot wait for the last row."""
    torch.manual_seed(0)
    x = torch.randn(40, 30)
    report = check(lambda x: (lambda y: y - y.mean())(x.sum(-1)), x, options={"target": target})
    assert len(report.kernels) >= 2


@pytest.mark.parametrize("target", _targets("cpp", "triton"))
def test_symbolic_rows_and_no_rows(target):
    torch.manual_seed(0)
    compiled = ember.compile(cross_entropy, dynamic=True, options={"target": target})
    for rows in (40, 7, 130):
        x, t = ce_inputs(rows, 50, torch.float32)
        assert_same(compiled(x, t), cross_entropy(x, t))
    x = torch.randn(0, 50)  # the mean over no rows: 0 / 0, as eager
    assert_same(ember.compile(cross_entropy, options={"target": target})(x, torch.zeros(0, dtype=torch.long)),
                cross_entropy(x, torch.zeros(0, dtype=torch.long)))


@pytest.mark.parametrize("target", _targets("cpp", "triton"))
def test_a_branch_after_every_row_has_its_condition(target):
    """A value after every row computed in a branch (schedule/guards.py) whose condition was
    computed before the rows: the code after the rows declared the branch but not its condition,
    so the C++ failed to build and the kernel ran through ATen with a warning (CI caught it in a
    float64 layer_norm's training graph)."""

    def repaired_mean(x, y):  # (a variance's mean repaired by its mean deviation, unless infinite)
        m = y.mean()
        return x.sum(-1), torch.where(torch.isinf(m), m, m + (y - m).sum() / y.numel())

    torch.manual_seed(0)
    x, y = torch.randn(37, 40, dtype=torch.float64), torch.randn(37, dtype=torch.float64)
    for inf in (False, True):
        y[5] = float("inf") if inf else y[5]
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="ember", category=RuntimeWarning)
            report = check(repaired_mean, x, y, options={"target": target})
        assert any("rowreduce" in k.kernel_ir for k in report.kernels)


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


CE_BACKWARDS = [  # (reduction, label smoothing, dtype, dynamic)
    ("mean", 0.0, torch.float32, False),
    ("sum", 0.0, torch.bfloat16, True),
    ("none", 0.1, torch.float32, False),
    ("mean", 0.1, torch.bfloat16, True),
]


@pytest.mark.parametrize("target", _targets("cpp", "triton", "triton-looped"))
def test_cross_entropy_backward_sums_no_row(target):
    """log_softmax's backward sums nll_loss's one-hot gradient over each row: passes/onehot.py
    turns that sum into a select per row, so the backward is one pass over the logits with no
    loop over the classes first. Gradients as eager's, ignored rows, label smoothing (a float
    coefficient of the symbolic class count, in the dynamic case) included; with the pass off,
    the sum is back."""
    torch.manual_seed(0)
    for reduction, smoothing, dtype, dynamic in CE_BACKWARDS:
        def fn(x, t, reduction=reduction, smoothing=smoothing):
            return F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing)

        for rows in (19, 5) if dynamic else (19,):
            x, t = ce_inputs(rows, 40, dtype)  # (3 chunks of the looped RBLOCK 16, the last masked)
            upstream = torch.randn(rows, dtype=dtype) if reduction == "none" else None
            grads = []
            for compiled in (True, False):
                a = x.clone().requires_grad_()
                report = ember.Report()
                run = ember.compile(fn, dynamic=dynamic, options=TARGETS[target], report=report) if compiled else fn
                with warnings.catch_warnings():
                    warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to ATen
                    loss = run(a, t)
                    loss.backward(upstream)
                grads.append((loss, a.grad))
                if compiled and smoothing == 0.0:
                    (backward,) = [g for g in report.graphs if g.kind == "backward"]
                    assert all(" reduce " not in k.kernel_ir for k in backward.kernels), \
                        [k.kernel_ir for k in backward.kernels]
            assert_same(*grads)
    report = ember.Report()
    a = x.clone().requires_grad_()
    options = {**TARGETS[target], "passes_off": ("one_hot_sums",)}
    ember.compile(cross_entropy, options=options, report=report)(a, t).backward()
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    assert any(" reduce sum" in k.kernel_ir for k in backward.kernels)


def test_passes_off_names_passes(monkeypatch):
    with pytest.raises(ValueError, match="no pass named"):
        ember.compile(cross_entropy, options={"passes_off": ("one_hot_sum",)})
    assert ember.config.replace(passes_off="cse").passes_off == ("cse",)
    # the variable, read when ember is imported: an error at compile, not a fallback per graph
    # (ember.config as importing ember makes it, Config() with the variable set: no process of its own)
    import importlib
    config_module = importlib.import_module("ember.config")
    monkeypatch.setenv("EMBER_PASSES_OFF", "bogus")
    monkeypatch.setattr(config_module, "config", config_module.Config())
    with pytest.raises(ValueError, match=re.escape("EMBER_PASSES_OFF: no pass named ['bogus']")):
        ember.compile(lambda x: x + 1)(torch.ones(2))


@pytest.mark.parametrize("target", _targets("cpp", "triton", "triton-looped"))
def test_cross_entropy_gradient_walks_rows_once(target, monkeypatch):
    """CE's gradient over long rows reads each row's statistics (max, log-sum, target) once, as a
    row kernel with one loop and no reduction (schedule/domains.py: _broadcast_rows), not once per
    element as a flat pointwise kernel would; only with rows enough to fill the GPU. (The
    thresholds are lowered here, as the interpreter runs the kernels.)"""
    from ember.schedule import domains
    monkeypatch.setattr(domains, "LONG_ROW", 32)
    monkeypatch.setattr(domains, "MIN_ROWS", 16)
    torch.manual_seed(0)
    x, t = ce_inputs(16, 40, torch.bfloat16)  # (rows of 3 looped chunks of 16, the last masked)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    report = ember.Report()
    loss = ember.compile(cross_entropy, dynamic=False, options=TARGETS[target], report=report)(a, t)
    loss.backward()
    cross_entropy(b, t).backward()
    assert_same((loss, a.grad), (cross_entropy(b, t), b.grad))
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    (kernel,) = backward.kernels
    assert "outer [16], inner [40]" in kernel.source and "1 inner loop(s)" in kernel.source
    assert " reduce " not in kernel.kernel_ir
    if target.startswith("triton"):  # the row's max is loaded before the loop over the row
        looped = kernel.source.split("else:")[-1]
        assert looped.index("tl.load(amax") < looped.index("for roffset")
    few = ce_inputs(8, 40, torch.float32)[0].requires_grad_()  # 8 rows: a flat kernel
    report = ember.Report()
    ember.compile(cross_entropy, dynamic=False, options=TARGETS[target], report=report)(few, t[:8]).backward()
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    assert all("0 inner loop(s)" in k.source for k in backward.kernels)


@needs_nvcc
def test_cross_entropy_gradient_row_kernel_compiles_for_sm90(tmp_path, monkeypatch):
    """The same row kernel with one loop and no reduction, in CUDA C++."""
    from ember.schedule import domains
    monkeypatch.setattr(domains, "LONG_ROW", 64)
    monkeypatch.setattr(domains, "MIN_ROWS", 16)
    x, t = ce_inputs(32, 100, torch.bfloat16)
    report = ember.Report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA kernels on a CPU-only machine are not run
        ember.compile(cross_entropy, dynamic=False, options={"target": "cuda"}, report=report)(
            x.requires_grad_(), t).backward()
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    (kernel,) = backward.kernels
    assert "// strategy: rows" in kernel.source and "1 inner loop(s)" in kernel.source
    compile_batches(sources(report, "ce_grad_rows"), tmp_path, per_file=2)


def test_any_pass_can_be_left_out():
    """passes_off: every pass is an optimization, so a training step compiles and matches eager
    without any one of them (the option exists to compare, not to work around)."""
    from ember.passes.pipeline import PASS_NAMES
    torch.manual_seed(0)
    x, t = ce_inputs(9, 70, torch.float32)
    b = x.clone().requires_grad_()
    expected = cross_entropy(b, t)
    expected.backward()
    for name in PASS_NAMES:
        a = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no graph may fall back to ATen
            loss = ember.compile(cross_entropy, options={"target": "cpp", "passes_off": (name,)})(a, t)
            loss.backward()
        assert_same((loss, a.grad), (expected, b.grad))
