"""The CPU backend's float32 exp (``ember_exp`` in codegen/cpp_prelude.py, which sigmoid, tanh,
erf and every softmax use) against the correctly rounded value, over every exponent the function
reaches and its ends; and softmax over CPU rows scaled by the reciprocal of the row's sum, as
eager's CPU kernel computes it (passes/softmax.py), graph in and graph out, and against eager."""

from __future__ import annotations

import math

import pytest
import torch

import ember
from ember.ir import GraphBuilder, structurally_equal, verify
from ember.passes.softmax import softmax_reciprocals

from .conftest import DEVICE
from .helpers import assert_clean, assert_gradients_match, assert_same, every_exponent, run, ulps

needs_cpu = pytest.mark.skipif(DEVICE != "cpu", reason="the CPU backend's exp and softmax")


@needs_cpu
def test_exp_is_within_an_ulp_over_every_exponent():
    x = every_exponent(-110, 90)
    out, report = run(torch.exp, x)
    assert_clean(report)
    exact = torch.exp(x.double())
    finite = exact < float(torch.finfo(torch.float32).max)
    err = ulps(out[finite], exact[finite])
    # (tools/check_cpu_math.py checks all 2^32 inputs: at most 1.023 ulp)
    assert err.max() <= 1.1, (err.max(), x[finite][err.argmax()])
    # past float32's largest value it is inf; where the exact value is under half the smallest
    # subnormal, 0
    assert torch.isinf(out[~finite]).all()
    assert (out[exact < 2.0 ** -150] == 0).all()


@needs_cpu
def test_exp_at_its_ends():
    values = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -103.97, -104.0, -104.01,
              -200.0, -3e38, 88.72283, 88.72284, 88.8, 89.0, 89.5, 1000.0, 3e38, -87.33655, -87.34, -100.0]
    x = torch.tensor(values)
    out, report = run(torch.exp, x)
    assert_clean(report)
    exact = torch.exp(x.double()).float()
    got = out.tolist()
    assert math.isnan(got[0]) and math.isnan(got[1])
    assert got[2:] == exact[2:].tolist(), list(zip(values[2:], got[2:], exact[2:].tolist()))


@needs_cpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_softmax_scales_by_the_reciprocal_of_the_row_sum(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 300, dtype=dtype)
    out, report = run(lambda x: torch.softmax(x, -1), x)
    assert_clean(report)
    source = "\n".join(k.source for k in report.kernels)
    assert "/ v" not in source.split("// loop 3")[-1], source  # the store loop multiplies
    assert_same(out, torch.softmax(x, -1))


@needs_cpu
def test_a_softmax_written_out_keeps_its_division():
    def written_out(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    x = torch.randn(64, 300)
    out, report = run(written_out, x)
    assert_clean(report)
    assert "/ v" in "\n".join(k.source for k in report.kernels).split("// loop 3")[-1]
    assert_same(out, written_out(x))


@needs_cpu
@pytest.mark.parametrize("shape, dim", [((0, 5), 1), ((5, 0), 1), ((1, 1), 0), ((3, 4, 5), 1), ((7,), 0)])
def test_softmax_over_awkward_rows_matches_eager(shape, dim):
    x = torch.randn(shape)
    x_t = torch.randn(tuple(reversed(shape))).mT if len(shape) == 2 else x
    for inp in (x, x_t):
        out, _ = run(lambda x: torch.softmax(x, dim), inp)
        assert_same(out, torch.softmax(inp, dim))


@needs_cpu
def test_softmax_with_symbolic_sizes_matches_eager():
    compiled = ember.compile(lambda x: torch.softmax(x, -1), dynamic=True)
    for rows, width in ((5, 33), (9, 7), (1, 300)):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(rows, width, dtype=dtype)
            assert_same(compiled(x), torch.softmax(x, -1))


@needs_cpu
def test_softmax_of_rows_of_minus_inf_and_nan_matches_eager():
    x = torch.randn(4, 6)
    x[1] = -float("inf")
    x[2, 3] = float("nan")
    x[3, 2] = float("inf")
    out, _ = run(lambda x: torch.softmax(x, -1), x)
    assert_same(out, torch.softmax(x, -1))


@needs_cpu
def test_softmax_gradient_on_the_cpu_matches_eager():
    x = torch.randn(8, 33, dtype=torch.float64, requires_grad=True)
    g = torch.randn(8, 33, dtype=torch.float64)
    out, _ = run(lambda x: torch.softmax(x, -1), x)
    (grad,) = torch.autograd.grad(out, x, g)
    (want,) = torch.autograd.grad(torch.softmax(x, -1), x, g)
    assert_same(grad, want)


def _softmax_graph(origin: str | None, device: str = "cpu", rows: int = 4):
    """exp(x - max) / sum as torch's decomposition writes it, its nodes from ``origin``."""
    b = GraphBuilder(device=device)
    x = b.input((rows, 8))
    e = b.exp(b.sub(x, b.expand(b.amax(x, [1]), (rows, 8))))
    out = b.div(e, b.expand(b.sum(e, [1]), (rows, 8)))
    for node in b.nodes[1:]:
        node.origin = origin
    return b.build(out)


def _scaled_graph(device: str = "cpu", rows: int = 4):
    b = GraphBuilder(device=device)
    x = b.input((rows, 8))
    e = b.exp(b.sub(x, b.expand(b.amax(x, [1]), (rows, 8))))
    return b.build(b.mul(e, b.expand(b.reciprocal(b.sum(e, [1])), (rows, 8))))


def _assert_pass(before, expected, **kwargs):
    verify(before)
    after = softmax_reciprocals(before, **kwargs)
    verify(after)
    assert structurally_equal(after, expected), f"got:\n{after}\n\nexpected:\n{expected}"


def test_a_softmax_quotient_becomes_a_product_on_the_cpp_backend():
    _assert_pass(_softmax_graph("aten._softmax"), _scaled_graph())
    _assert_pass(_softmax_graph("aten._safe_softmax"), _scaled_graph())
    # a CUDA graph rendered as C++ too; a CPU graph rendered for a GPU backend keeps its division
    _assert_pass(_softmax_graph("aten._softmax", "cuda:0"), _scaled_graph("cuda:0"), target="cpp")
    for target in ("triton", "cuda"):
        before = _softmax_graph("aten._softmax")
        _assert_pass(before, before, target=target)


def test_other_quotients_keep_their_division():
    # a softmax written out divides in eager too; a GPU softmax divides in eager's CUDA kernel
    for before in (_softmax_graph(None), _softmax_graph("aten.div"), _softmax_graph("aten._softmax", "cuda:0")):
        _assert_pass(before, before)
    # a softmax's division by something other than an expanded sum
    b = GraphBuilder()
    x, y = b.input((4, 8)), b.input((4, 8))
    out = b.div(b.exp(x), y)
    out.origin = "aten._softmax"
    before = b.build(out)
    _assert_pass(before, before)


def test_a_softmax_recomputed_from_its_saved_sum_takes_the_same_reciprocal():
    b = GraphBuilder()
    x, row_max, row_sum = b.input((4, 8)), b.input((4, 1)), b.input((4, 1))
    e = b.exp(b.sub(x, b.expand(row_max, (4, 8))))
    out = b.div(e, b.expand(row_sum, (4, 8)))
    for node in b.nodes[3:]:
        node.origin = "aten._softmax"
    before = b.build(out)
    b = GraphBuilder()
    x, row_max, row_sum = b.input((4, 8)), b.input((4, 1)), b.input((4, 1))
    e = b.exp(b.sub(x, b.expand(row_max, (4, 8))))
    expected = b.build(b.mul(e, b.expand(b.reciprocal(row_sum), (4, 8))))
    _assert_pass(before, expected)


@pytest.mark.parametrize("seed", range(4))
def test_a_max_of_a_softmax_has_eagers_gradient(seed):
    # amax's gradient goes to the elements equal to the maximum the forward saved; the backward
    # recomputes the softmax from its saved max and sum, so it must get the forward's bits, or a
    # column has no element equal to its maximum and its gradient is 0 / 0 (every row NaN)
    x = torch.randn(64, 33, generator=torch.Generator().manual_seed(seed))
    assert_gradients_match(lambda x: torch.softmax(x, -1).amax(0), x.to(DEVICE))
