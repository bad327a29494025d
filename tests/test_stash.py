"""A row kernel's last loop reads back what an earlier loop stored in its output, or in the
thread's scratch row, instead of computing it again (schedule/loops.py: stash_recomputed, used by
the CPU backend): a softmax's exp(x - max) is computed once per element. Checked against eager,
with the kernel source read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_same, check
from .test_inplace import _written_over


def manual_softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def _loops(source: str) -> list[str]:
    """The bodies of a C++ kernel's inner loops, by their '// loop k' comments."""
    parts = source.split("// loop ")[1:]
    return [p.split("\n", 1)[1] for p in parts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [
    manual_softmax,
    lambda x: torch.softmax(x, -1),
    lambda x: torch.tanh(x) / torch.tanh(x).sum(-1, keepdim=True),
], ids=["manual", "softmax", "tanh-normalized"])
def test_the_last_loop_reads_back_what_the_earlier_loop_stored(fn, dtype):
    x = torch.randn(37, 301, dtype=dtype)
    report = check(fn, x)
    (kernel,) = report.kernels
    *earlier, last = _loops(kernel.source)
    assert "ember_exp(" not in last and "tanh(" not in last, kernel.source
    assert sum(s.count("buf0[") for s in earlier) == 1  # the stash: one store in the earlier loop


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(8, 64), (1, 1), (3, 0), (0, 7), (5, 2, 33)])
def test_16_bit_outputs_keep_the_float32_value_in_a_scratch_row(dtype, shape):
    # stored into the 16-bit output it would be rounded: the thread's float32 scratch row keeps it
    x = torch.randn(shape, dtype=dtype)
    report = check(lambda x: torch.softmax(x, -1), x)
    if x.numel() == 0 or x.shape[-1] == 1:
        return  # (nothing to compute, or rows of one: a softmax of ones)
    (kernel,) = report.kernels
    *earlier, last = _loops(kernel.source)
    assert "ember_exp(" not in last and "ember_scratch[" in last, kernel.source
    assert sum(s.count("ember_scratch[") for s in earlier) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(8, 64), (1, 1), (0, 7), (5, 2, 33), (4, 1500)])
def test_16_bit_ops_written_out_compute_exp_once(dtype, shape):
    # exp(x - max) over 16-bit tensors is a 16-bit value computed in float32: its sum reads it
    # rounded, as eager holds it, and the quotient unrounded, from the scratch row. The sum's
    # rounding once rounded the whole chain op by op, so the exp was computed twice in loop 2
    x = torch.randn(shape, dtype=dtype) * 4
    report = check(manual_softmax, x)
    if x.numel() == 0 or x.shape[-1] == 1:
        return
    (kernel,) = report.kernels
    *earlier, last = _loops(kernel.source)
    assert kernel.source.count("ember_exp(") == 1, kernel.source
    assert "ember_scratch[" in last and sum(s.count("ember_scratch[") for s in earlier) == 1, kernel.source


def test_a_scratch_row_for_symbolic_and_non_contiguous_rows():
    for n in (5, 19, 64):
        report = check(lambda x: torch.softmax(x, -1), torch.randn(7, n, dtype=torch.bfloat16), dynamic=True)
    assert "ember_scratch_row<float>(s" in report.kernels[0].source  # sized by the row's symbol
    check(lambda x: torch.softmax(x, -1), torch.randn(40, 30, dtype=torch.float16).t())


def test_a_row_longer_than_the_scratch_limit_computes_again():
    from ember.codegen.cpp import SCRATCH_ROW_LIMIT

    report = check(lambda x: torch.softmax(x, -1), torch.randn(2, SCRATCH_ROW_LIMIT + 1, dtype=torch.bfloat16))
    assert "ember_scratch" not in report.kernels[0].source
    assert "ember_exp(" in _loops(report.kernels[0].source)[-1]


@pytest.mark.parametrize("fn", [
    lambda x: torch.softmax(x, 0),     # column tiles: a thread walks many rows at once
    lambda x: torch.softmax(x[0], 0),  # one row, spread over the threads
], ids=["columns", "one-row"])
def test_no_scratch_row_where_a_thread_does_not_own_the_row(fn):
    report = check(fn, torch.randn(300, 40, dtype=torch.bfloat16))
    # (the stash's row; column runs keep their accumulators in scratch rows of their own)
    assert all("ember_scratch[" not in k.source for k in report.kernels)


@pytest.mark.parametrize("fn", [
    lambda x: x - x.amax(-1, keepdim=True),                                  # nothing costly to keep
    lambda x: F.log_softmax(x, -1),                                          # the last loop needs no exp
], ids=["subtract", "log_softmax"])
def test_cheap_or_unneeded_values_are_not_stored(fn):
    x = torch.randn(16, 40)
    report = check(fn, x)
    for k in report.kernels:
        assert all(s.count("buf") <= 1 for s in _loops(k.source)[:-1]), k.source


def test_written_over_its_input_with_the_stash():
    # the product dies in the softmax kernel, which writes its output over it: loop 2 stores
    # exp over the product's element after reading it, loop 3 reads only the output
    x, w = torch.randn(20, 8), torch.randn(8, 130)
    report = check(lambda x, w: torch.softmax(x @ w, -1), x, w)
    assert len(_written_over(report)) == 1
    assert "ember_exp(" not in _loops(report.kernels[0].source)[-1]


def test_no_stash_in_the_output_where_the_last_loop_reads_the_input_at_the_same_element():
    # y * softmax(y): loop 3 reads y again, and the output may be written over y (it dies here),
    # so loop 2 must not store into the output before it: the scratch row keeps exp instead
    x, w = torch.randn(20, 8), torch.randn(8, 130)

    def fn(x, w):
        y = x @ w
        e = torch.exp(y - y.amax(-1, keepdim=True))
        return y * e / e.sum(-1, keepdim=True)

    report = check(fn, x, w)
    *earlier, last = _loops(report.kernels[0].source)
    assert "ember_exp(" not in last and "ember_scratch[" in last
    (out,) = {s.split("[", 1)[0].split()[-1] for s in last.splitlines() if "] = " in s}
    assert all(f"{out}[" not in s for s in earlier)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (4, 1), (2, 3, 17)])
def test_awkward_shapes(shape):
    check(lambda x: torch.softmax(x, -1), torch.randn(shape))


def test_non_contiguous_and_symbolic_rows():
    x = torch.randn(40, 30).t()
    check(manual_softmax, x)
    for n in (5, 19, 64):
        check(manual_softmax, torch.randn(7, n), dynamic=True)


def test_two_outputs_of_one_row():
    # the softmax and its row sum both leave the kernel; the output that is stashed into is
    # written once by the last loop
    def fn(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        s = e.sum(-1, keepdim=True)
        return e / s, s, torch.sigmoid(e) * 2

    check(fn, torch.randn(12, 50))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_training_step(dtype):
    # the backward's softmax gradient rows recompute exp too; gradients as eager's
    x = torch.randn(16, 33, dtype=dtype)
    w = torch.randn(33, dtype=dtype)

    def loss(x, w):
        return (torch.softmax(x * w, -1) * torch.arange(33.0, dtype=dtype)).sum()

    report = ember.Report()
    compiled = ember.compile(loss, report=report)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    compiled(xs, ws).backward()
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    loss(xe, we).backward()
    assert_same((xs.grad, ws.grad), (xe.grad, we.grad))
    assert all(k.built for k in report.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_jagged_softmax_keeps_exp_in_a_scratch_row_of_the_row_s_length(dtype):
    # a segment row's store has the row's start bound into its index: the output cannot hold
    # the value, a scratch row the length of the row can
    from ember import ragged

    rows = [torch.randn(n, dtype=dtype) * 3 for n in (3, 0, 5, 1, 12, 300)]
    r = ragged.from_list(rows, feature_shape=(), dtype=dtype)
    report = check(lambda r: ragged.jagged_softmax(r).values, r)
    (source,) = [k.source for k in report.kernels if "ember_seglen" in k.source]
    assert "ember_scratch_row<float>(ember_seglen)" in source
    assert "ember_exp(" not in _loops(source)[-1]
