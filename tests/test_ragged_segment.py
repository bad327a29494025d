"""ember.ragged's segment reductions and jagged softmax, against a Python loop over the rows."""

from __future__ import annotations

import pytest
import torch

import ember
from ember import ragged
from ember.ragged import Ragged

from .conftest import DEVICE

LENGTHS = [[3, 0, 5, 1], [7], [0, 0, 0], [2, 2], [1] * 6, [0, 40, 3, 0]]
FEATURES = [(), (4,), (2, 3)]


def make(lengths: list[int], feature: tuple[int, ...] = (4,), dtype: torch.dtype = torch.float32,
         offsets_dtype: torch.dtype = torch.int64, seed: int = 0) -> Ragged:
    gen = torch.Generator().manual_seed(seed)
    rows = [(torch.randn((n, *feature), generator=gen) * 3).to(dtype) for n in lengths]
    return ragged.from_list(rows, feature_shape=feature, dtype=dtype, offsets_dtype=offsets_dtype)


def loop(r: Ragged, reduce: str) -> torch.Tensor:
    """The obvious per-row reference, in float64."""
    out = []
    for row in r.to_list():
        row = row.double()
        if reduce == "sum":
            out.append(row.sum(0))
        elif reduce == "mean":
            out.append(row.mean(0) if row.shape[0] else row.new_zeros(row.shape[1:]))
        else:
            out.append(row.amax(0) if row.shape[0] else row.new_full(row.shape[1:], float("-inf")))
    return torch.stack(out) if out else torch.zeros((0, *r.feature_shape), dtype=torch.float64)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("feature", FEATURES)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_reductions_match_a_loop(lengths, feature, reduce):
    r = make(lengths, feature)
    fn = {"sum": ragged.segment_sum, "mean": ragged.segment_mean, "max": ragged.segment_max}[reduce]
    out = fn(r)
    assert out.shape == (len(lengths), *feature) and out.dtype == r.dtype
    torch.testing.assert_close(out.double(), loop(r, reduce), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("feature", FEATURES)
def test_jagged_softmax_matches_a_loop(lengths, feature):
    r = make(lengths, feature, offsets_dtype=torch.int32)
    out = ragged.jagged_softmax(r)
    assert isinstance(out, Ragged) and out.offsets is r.offsets and out.max_length == r.max_length
    expected = [row.double().softmax(0) for row in r.to_list()]
    for got, want in zip(out.to_list(), expected):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_accumulates_in_float32(dtype):
    # 500 rows of 1s and a large offset: a 16-bit running sum would stall long before 500
    lengths = [500, 3]
    r = Ragged(torch.ones(503, 2, dtype=dtype) + 64, torch.tensor([0, 500, 503]))
    torch.testing.assert_close(ragged.segment_sum(r).double(), loop(r, "sum"), rtol=4e-3, atol=0)
    torch.testing.assert_close(ragged.segment_mean(r).double(), torch.full((2, 2), 65.0, dtype=torch.float64))
    s = make(lengths, (), dtype=dtype)
    got = ragged.jagged_softmax(s)
    assert got.dtype == dtype
    for row, want in zip(got.to_list(), s.to_list()):
        torch.testing.assert_close(row.double(), want.double().softmax(0), rtol=2e-2, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_small_integer_sums_do_not_wrap(dtype):
    # three 100s (uint8: 200s) summed in their own dtype wrapped (uint8 600 -> 88); Tensor.sum
    # sums integers in int64, and so does segment_sum now, compiled or not
    big = 200 if dtype == torch.uint8 else 100
    r = Ragged(torch.full((4, 2), big, dtype=dtype, device=DEVICE), torch.tensor([0, 3, 3, 4], device=DEVICE))
    expected = torch.stack([r.values[:3].sum(0), r.values[3:3].sum(0), r.values[3:].sum(0)])
    assert expected.dtype == torch.int64
    assert torch.equal(ragged.segment_sum(r), expected)
    assert torch.equal(ember.compile(ragged.segment_sum)(r), expected)


def test_integer_sum_and_max():
    r = Ragged(torch.tensor([1, 5, 2, 7, 3], dtype=torch.int32), torch.tensor([0, 2, 2, 5]))
    assert ragged.segment_sum(r).tolist() == [6, 0, 12]
    assert ragged.segment_sum(r).dtype == torch.int64  # as Tensor.sum promotes integers
    assert ragged.segment_max(r).tolist() == [5, torch.iinfo(torch.int32).min, 7]
    with pytest.raises(TypeError, match="floating-point"):
        ragged.segment_mean(r)
    with pytest.raises(TypeError, match="expects a Ragged"):
        ragged.segment_sum(torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_sums_keep_their_dtype(dtype):
    # (the docstring promised complex sums; segment_reduce refused complex values with TypeError)
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randn(n, 3, generator=gen, dtype=dtype) for n in (2, 0, 4)]
    r = ragged.from_list([x.to(DEVICE) for x in rows])
    expected = torch.stack([x.sum(0) for x in rows]).to(DEVICE)
    for fn in (ragged.segment_sum, ember.compile(ragged.segment_sum)):
        got = fn(r)
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected)
    leaf = r.values.detach().clone().requires_grad_()
    ember.compile(lambda r: ragged.segment_sum(r).abs().sum())(Ragged(leaf, r.offsets)).backward()
    want = r.values.detach().clone().requires_grad_()
    torch.stack([x.sum(0) for x in want.split([2, 0, 4])]).abs().sum().backward()
    torch.testing.assert_close(leaf.grad, want.grad)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "softmax", "max_nan"])
def test_gradients_match_a_loop(reduce):
    lengths = [3, 0, 5, 1, 4]
    r = make(lengths, (3,), dtype=torch.float64)
    if reduce == "max_nan":
        # a row whose max is NaN: amax's gradient is NaN in all its elements (the where that
        # split the gradient between the maxima gave 0 there)
        reduce = "max"
        r.values[4, 1] = float("nan")
    values = r.values.clone().requires_grad_()
    loop_values = r.values.clone().requires_grad_()
    mine = Ragged(values, r.offsets)
    if reduce == "softmax":
        out = ragged.jagged_softmax(mine).values
        ref = torch.cat([row.softmax(0) for row in loop_values.split(lengths)])
    else:
        out = {"sum": ragged.segment_sum, "mean": ragged.segment_mean, "max": ragged.segment_max}[reduce](mine)
        rows = [row for row in loop_values.split(lengths) if row.shape[0]]
        op = {"sum": lambda x: x.sum(0), "mean": lambda x: x.mean(0), "max": lambda x: x.amax(0)}[reduce]
        ref = torch.stack([op(row) for row in rows])
        out = out[torch.tensor(lengths) > 0]
    weight = torch.randn_like(ref)
    (out * weight).sum().backward()
    (ref * weight).sum().backward()
    torch.testing.assert_close(values.grad, loop_values.grad, equal_nan=True)


@pytest.mark.parametrize("fn", [ragged.segment_sum, ragged.segment_mean, ragged.segment_max,
                                lambda r: ragged.jagged_softmax(r).values])
def test_one_graph_no_host_sync(fn):
    """fullgraph=True fails on any read of tensor data on the host (.item, .tolist, bool())."""
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    for lengths in ([3, 0, 5], [2, 7, 1]):
        r = make(lengths, (4,))
        torch.testing.assert_close(compiled(r), fn(r))


def test_a_max_compared_in_the_backward_reads_the_sum_its_kernel_read():
    # softmax over 3 features, its max per token, then a jagged softmax and a logsumexp: the
    # forward's gradient-in-forward plan computes x == max in a later kernel than the max. The
    # softmax's sum, buffered for both, was released (its readers all in the first kernel, but
    # for the later kernel's inlined quotient) and summed again there in another order: in 17 of
    # 120 rows no element equalled the max, and its gradient divided by that count, 0: NaN
    # (CPU fuzz seed 537474434310)
    def fn(values, offsets):
        probs = torch.softmax(values, -1).amax(-1)
        return torch.logsumexp(ragged.jagged_softmax(Ragged(probs, offsets, 70, validate=False)).values, 0)

    g = torch.Generator().manual_seed(1415021675)
    base = torch.randn(3, 120, generator=g)
    offsets = torch.tensor([0, 17, 17, 87, 109, 120])
    mine, ref = (base.t().clone().requires_grad_() for _ in range(2))  # (transposed, as the fuzzer's)
    ember.compile(fn, dynamic=True)(mine, offsets).backward()
    fn(ref, offsets).backward()
    assert not mine.grad.isnan().any()
    torch.testing.assert_close(mine.grad, ref.grad)
