"""C++ pointwise kernels over several dims compute what does not vary along the innermost dim
once per row, before its simd loop (codegen/cpp_split.py: row_invariants): a row's
``log(sum)`` inside the loop left it scalar (logf has no vector form), and a cross-entropy's
gradient over 1024 x 4096 logits took 18 ms where 1.6 sufficed. Sources, then programs against
eager over dtypes and awkward shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .conftest import DEVICE
from .helpers import assert_clean, assert_same, run

needs_cpu = pytest.mark.skipif(DEVICE != "cpu", reason="the C++ backend's loops")


def _scaled_exp(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.exp(x - torch.log(s)[:, None])


def _loop_of(source: str, needle: str) -> str:
    """The text of ``source`` from the last simd loop before ``needle`` on."""
    head = source[:source.index(needle)]
    return source[head.rindex("#pragma omp simd"):]


@needs_cpu
def test_a_rows_log_is_computed_before_the_simd_loop():
    x, s = torch.randn(8, 300), torch.rand(8) + 0.5
    out, report = run(_scaled_exp, x, s)
    assert_clean(report)
    (kernel,) = report.kernels
    assert "ember_log(" in kernel.source
    assert "the same along o1: computed once, before its loop" in kernel.source, kernel.source
    assert "ember_log(" not in _loop_of(kernel.source, "ember_exp("), kernel.source
    assert_same(out, _scaled_exp(x, s))


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(5, 7), (0, 7), (5, 0), (1, 1), (3, 129)], ids=str)
def test_row_invariants_match_eager(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype)
    s = (torch.rand(shape[0]) + 0.5).to(dtype)
    x_t = torch.randn(tuple(reversed(shape)), dtype=dtype).mT  # (non-contiguous rows)
    for inp in (x, x_t):
        out, report = run(_scaled_exp, inp, s)
        assert_clean(report)
        assert_same(out, _scaled_exp(inp, s))


@needs_cpu
def test_row_invariants_with_symbolic_sizes_and_empty_rows():
    # a symbolic row length: the hoisted loads wait for a row with elements
    compiled = ember.compile(_scaled_exp, dynamic=True)
    for rows, width in ((5, 33), (9, 0), (1, 300), (4, 1)):
        x, s = torch.randn(rows, width), torch.rand(rows) + 0.5
        assert_same(compiled(x, s), _scaled_exp(x, s))


@needs_cpu
def test_a_rows_integer_division_stays_in_the_loop():
    # it may raise: only where an element computes it, as in eager
    def divide(x, d):
        return x // d[:, None] + 1

    compiled = ember.compile(divide, dynamic=True)
    x, d = torch.randint(-50, 50, (4, 6)), torch.tensor([3, -2, 5, 7])
    assert_same(compiled(x, d), divide(x, d))
    empty, zeros = torch.empty(3, 0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    assert_same(compiled(empty, zeros), divide(empty, zeros))  # no element: nothing raised
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        divide(x, torch.tensor([3, 0, 5, 7]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(x, torch.tensor([3, 0, 5, 7]))


@needs_cpu
def test_cross_entropy_gradient_in_the_forward_over_symbolic_rows():
    # the gradient computed in the forward (frontend/partition.py) is a pointwise kernel over
    # (rows, classes) whose rows' log(sum) was in its loop
    def loss(logits, targets):
        return F.cross_entropy(logits, targets, ignore_index=-1)

    compiled = ember.compile(loss, dynamic=True)
    for rows in (6, 17, 1):
        torch.manual_seed(rows)
        logits = torch.randn(rows, 40, requires_grad=True)
        targets = torch.randint(0, 40, (rows,))
        targets[0] = -1 if rows > 1 else targets[0]
        ref_logits = logits.detach().clone().requires_grad_()
        out = compiled(logits, targets)
        ref = loss(ref_logits, targets)
        out.backward()
        ref.backward()
        assert_same(out, ref)
        assert_same(logits.grad, ref_logits.grad)
