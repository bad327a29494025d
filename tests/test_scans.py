"""Cumulative scans (cumsum, cumprod, logcumsumexp) generated as scan kernels: against eager on
the CPU, under Triton's interpreter, and compiled for sm_90 with nvcc (CUDA C++); their fusion
with producers and consumers, reversed scans (a cumsum's gradient), symbolic lengths."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

import ember
from ember.codegen import cuda

from .conftest import INTERPRETED_TRITON
from .helpers import check

LOOPED = {"target": "triton", "triton_launch": {"PERSISTENT": False, "RBLOCK": 16}}


def _scans(x):
    return x.cumsum(-1), x.cumsum(0), x.cumprod(1) if not x.dtype.is_floating_point else (1 + x * 0.01).cumprod(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int32, torch.int64, torch.uint8, torch.bool])
def test_cumsum_cumprod_dtypes_one_kernel(dtype):
    x = torch.randn(6, 300) if dtype.is_floating_point else torch.randint(0, 5, (6, 300))
    report = check(_scans, x.to(dtype), rtol=0, atol=0)  # eager's accumulation, exactly
    assert not report.fallbacks and len(report.kernels) == 2  # (one per scanned dim)


def test_scan_edges_match_eager():
    x = torch.randn(3, 9)
    x[1, 2], x[2, 3], x[0, 1] = float("nan"), float("inf"), float("-inf")
    check(lambda x: (x.cumsum(1), x.cumprod(1), x.logcumsumexp(1)), x)
    ends = torch.full((2, 6), float("-inf"))
    ends[1, 3:5] = float("inf")
    check(lambda x: x.logcumsumexp(1), ends)
    check(lambda x: (x.logcumsumexp(0), x.logcumsumexp(-1)), torch.randn(40, 30).bfloat16())
    check(lambda x: (x.cumsum(0, dtype=torch.int8), x.cumsum(1, dtype=torch.float32)),
          torch.randint(0, 100, (4, 50), dtype=torch.int16), rtol=0, atol=0)
    for x in (torch.tensor(3.0), torch.tensor(3), torch.randn(3, 1), torch.randn(3, 0), torch.randn(0, 4)):
        check(lambda x: x.cumsum(-1), x)  # no element or one along the dim: no scan kernel
    check(lambda x: x.t().cumsum(1), torch.randn(30, 20))       # transposed input
    check(lambda x: x[:, ::2].cumsum(0), torch.randn(30, 20))   # strided input
    check(lambda x: x.cumsum(1), torch.randn(2, 3, 4, 5))       # a middle dim
    check(lambda x: (x.cumsum(1).cumsum(0), x.cumsum(1) / x.sum(1, keepdim=True)), torch.randn(4, 40))
    check(lambda x: x.cumsum(1).cumsum(1) * 2, torch.randn(4, 40))  # a scan of a scan, one kernel
    for f in (lambda x: x.cumsum(1), lambda x: (x.cumsum(1), x.logcumsumexp(1))):
        check(f, torch.randn(2, 9000))  # (GPUs: several chunks a row, in both CUDA layouts)


def _ties_nan_zeros(shape, dtype=torch.float32):
    """Elements drawn from few values: ties, NaN, +-0.0 and infinities (only their range for
    integers and bools)."""
    values = torch.tensor([0.0, -0.0, 1.0, float("nan"), -1.0, float("inf"), float("-inf"), 1.0])
    if not dtype.is_floating_point:
        values = torch.tensor([0, 1, 2, -1, 1, 0, 2, 1]) if dtype is not torch.bool else torch.arange(8) % 2
    return values[torch.randint(0, 8, shape, generator=torch.Generator().manual_seed(0))].to(dtype)


def _extrema(x, dim):
    values, indices = x.cummax(dim)
    low, where = x.cummin(dim)
    if x.dtype.is_floating_point:  # (-0.0 replaces 0.0 on a tie: compared through their sign bits)
        return values, indices, low, where, values.signbit(), low.signbit()
    return values, indices, low, where


def test_cummax_cummin_match_eager():
    """Values and indices, exactly: ties take the later index, a NaN sticks with its latest
    index, -0.0 replaces 0.0; over dtypes, dims, sizes 0 and 1, strided and transposed inputs."""
    def fn(f, h, b, d, i, u, m, e0, e1):
        return (*_extrema(f, 1), *_extrema(f, 0), *_extrema(f.t()[::2], 1), *_extrema(h * 2, -1),
                *_extrema(b, 0), *_extrema(d, 2), *_extrema(i, 1), *_extrema(u, 0), *_extrema(m, 1),
                *_extrema(e0, 1), *_extrema(e1, 1), *_extrema(e0[0, 0], 0))

    args = [_ties_nan_zeros((6, 300)), _ties_nan_zeros((4, 33), torch.float16),
            _ties_nan_zeros((33, 4), torch.bfloat16), _ties_nan_zeros((2, 3, 17), torch.float64),
            _ties_nan_zeros((3, 40), torch.int32), _ties_nan_zeros((9, 2), torch.uint8),
            _ties_nan_zeros((3, 40), torch.bool), torch.randn(3, 1), torch.randn(3, 0)]
    report = check(fn, *args)
    assert not report.fallbacks
    check(lambda x: _extrema(x, -1), torch.randint(-50, 50, (2, 70), dtype=torch.int8))


def test_producers_and_consumers_fuse():
    def position_ids(x, mask):  # an attention mask's positions, and a pointwise producer
        return mask.long().cumsum(-1) - 1, (torch.relu(x) + 1).cumsum(-1) * 2

    report = check(position_ids, torch.randn(4, 33), torch.rand(4, 33) > 0.3)
    assert len(report.kernels) == 1 and not report.fallbacks
    (k,) = report.kernels
    assert all(op in k.name for op in ("cumsum", "relu", "sub")), k.name
    # a broadcast producer
    report = check(lambda x, y: (x + y).cumsum(1), torch.randn(30, 1), torch.randn(20))
    assert len(report.kernels) == 1


def test_reversed_scans_and_gradients():
    """flip(cumsum(flip(x))) is one reversed scan (the gradient of a cumsum), one kernel."""
    for f in (lambda x: x.flip(1).cumsum(1).flip(1), lambda x: x.flip(0).logcumsumexp(0).flip(0) * 2,
              lambda x: x.flip(1).cumsum(1).logcumsumexp(1).flip(1)):  # (scans chained between the flips)
        report = check(f, torch.randn(5, 37))
        (k,) = report.kernels
        assert re.search(r"for \(int64_t r0 = \d+ - 1; r0 >= 0; --r0\)", k.source), k.source
    x = torch.randn(4, 30, requires_grad=True)
    for f in (lambda x: (x.cumsum(-1) ** 2).sum(), lambda x: (x.logcumsumexp(-1) ** 2).sum(),
              lambda x: (x.cumprod(0) ** 2).sum(), lambda x: (x.cummax(1).values * x).sum(),
              lambda x: (x.round().cummin(0)[0] ** 2).sum()):  # (round: ties share the gradient's index)
        (expected,) = torch.autograd.grad(f(x), x)
        report = ember.Report()
        (got,) = torch.autograd.grad(ember.compile(f, report=report)(x), x)
        torch.testing.assert_close(got, expected)
        assert not report.fallbacks


def test_offsets_from_lengths_are_one_scan_kernel():
    """cat([zeros, cumsum]) and F.pad(cumsum, (k, 0)): the scan of the padded input, one kernel."""
    F = torch.nn.functional
    cases = [
        (lambda n: torch.cat([n.new_zeros(1), n.cumsum(0)]), torch.randint(0, 9, (7,), dtype=torch.int32)),
        (lambda n: torch.cat([torch.zeros(2, dtype=torch.int64), n.cumsum(0)]), torch.randint(0, 9, (300,))),
        (lambda x: F.pad(x.cumsum(-1), (1, 0)), torch.randn(4, 33)),
        (lambda x: F.pad((1 + 0.1 * x).cumprod(1), (2, 0), value=1.0), torch.randn(4, 33)),
        (lambda x: torch.cat([torch.full((3, 1), float("-inf")), x.logcumsumexp(1)], 1), torch.randn(3, 20)),
        (lambda x: torch.cat([x.flip(0).cumsum(0).flip(0), x.new_zeros(1, 5)]), torch.randn(9, 5)),
    ]
    for fn, x in cases:
        report = check(fn, x, rtol=0, atol=0) if not x.is_floating_point() else check(fn, x)
        assert len(report.kernels) == 1 and not report.fallbacks, [k.name for k in report.kernels]
    # not the neutral, or promoted by the cat: still eager's values
    check(lambda n: torch.cat([n.new_ones(1), n.cumsum(0)]), torch.randint(0, 9, (7,)), rtol=0, atol=0)
    check(lambda n: torch.cat([torch.zeros(1), n.cumsum(0)]), torch.randint(0, 9, (7,)))
    check(lambda x: torch.cat([x.cumsum(0), x.new_zeros(1)]), torch.randn(7))
    fast = ember.compile(lambda n: torch.cat([n.new_zeros(1), n.cumsum(0)]), dynamic=True)
    before = ember.stats()["graphs_compiled"]
    for n in (5, 9, 100):
        lengths = torch.randint(0, 9, (n,))
        assert torch.equal(fast(lengths), torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]))
    assert ember.stats()["graphs_compiled"] - before <= 1


def test_scans_cropped_or_padded_with_negative_zero_keep_eagers_values():
    """A pad with a negative amount crops the scan's result (the scan of the cropped input gave
    other values), and a pad of -0.0 is no sum's neutral (the scan started from 0.0)."""
    F = torch.nn.functional
    x = torch.randn(3, 6)
    for fn in (lambda x: F.pad(x.cumsum(-1), (-2, 0)),
               lambda x: F.pad(x.flip(-1).cumsum(-1).flip(-1), (0, -1))):
        check(fn, x)
    zeros = torch.full((2, 3), -0.0)
    for fn in (lambda x: F.pad(x.cumsum(-1), (1, 0), value=-0.0),
               lambda x: torch.cat([torch.full((2, 1), -0.0), x.cumsum(-1)], -1)):
        out, ref = ember.compile(fn)(zeros), fn(zeros)
        assert torch.equal(out.signbit(), ref.signbit()), (out, ref)


def test_symbolic_lengths_one_compile():
    fn = lambda x: (x * 2).cumsum(-1) + x.logcumsumexp(0) + x.cummax(-1)[0] * x.cummin(0)[1]  # noqa: E731
    fast = ember.compile(fn, dynamic=True)
    before = ember.stats()["graphs_compiled"]
    for n in (5, 9, 100):
        x = torch.randn(3, n)
        torch.testing.assert_close(fast(x), fn(x))
    assert ember.stats()["graphs_compiled"] - before <= 1


@INTERPRETED_TRITON
@pytest.mark.parametrize("options", [{"target": "triton"}, LOOPED], ids=["tuned", "looped"])
def test_triton_scans(options):
    # (float16, not bfloat16: the interpreter truncates float32 to bfloat16 where GPUs round)
    dtype = torch.float32 if options is LOOPED else torch.float16
    report = check(lambda x: (x.cumsum(-1) * 2, (1 + 0.01 * x).cumprod(0), x.logcumsumexp(1)),
                   torch.randn(3, 40, dtype=dtype), options=options)
    assert all("tl.associative_scan" in k.source for k in report.kernels)
    x = torch.randn(3, 37)
    x[1, 2], x[2, 3], x[0, 1] = float("nan"), float("inf"), float("-inf")
    check(lambda x: (x.logcumsumexp(1), x.flip(1).cumsum(1).flip(1)), x, options=options)
    check(lambda m: m.cumsum(0) - 1, torch.randint(0, 2, (33,)), options=options)
    check(lambda x, i: (*_extrema(x, 1), *_extrema(i, 0)), _ties_nan_zeros((3, 37)),
          _ties_nan_zeros((37, 2), torch.int64), options=options)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_cuda_scans_compile_for_sm90(tmp_path):
    cases = [
        (lambda x: (torch.relu(x) + 1).cumsum(-1) * 2, torch.randn(8, 16)),
        (lambda x: (x.cumsum(-1), (1 + 0.01 * x).cumprod(0), x.logcumsumexp(1)), torch.randn(5, 70)),
        (lambda x: (x.cumsum(-1), x.logcumsumexp(1)), torch.randn(5, 72).bfloat16()),
        (lambda x: (x.cumsum(-1), x.logcumsumexp(0)), torch.randn(5, 70).double()),
        (lambda x: x.cumsum(-1) - 1, torch.randint(0, 2, (5, 70))),
        (lambda x: x.flip(1).cumsum(1).flip(1), torch.randn(4, 40)),
        (lambda x: x.cumsum(1).cumsum(1), torch.randn(4, 40)),  # (a thread an element: scans chained)
        (lambda x: x.cumsum(1, dtype=torch.int32), torch.randint(0, 9, (4, 40), dtype=torch.int32)),
        # chained scans of int8 (a block-wide scan of 8-bit integers, whose shuffles give int32)
        (lambda x: x.cumsum(1, dtype=torch.int8).cumprod(1), torch.randint(-3, 3, (4, 40), dtype=torch.int8)),
        # cummax, cummin: values and indices (the indices' scan reads the values': chained), and
        # values alone (warps' runs) of 8- and 16-bit integers and floats
        (lambda x: (*x.cummax(1), *x.cummin(-1)), torch.randn(5, 70)),
        (lambda x: (x.cummax(1).values, x.cummin(1).values * 2), torch.randn(5, 70).bfloat16()),
        (lambda x: x.cummin(-1), torch.randint(0, 9, (5, 70), dtype=torch.int8)),
        (lambda x: (x.cummin(-1).values, x.short().cummax(-1).values), torch.randint(0, 9, (5, 70), dtype=torch.uint8)),
        (lambda x: x.cummax(-1), torch.rand(5, 70) > 0.5),
        # rows read in reverse (a gather: the row's index is a value), each loaded 8 at a time
        (lambda x: x.flip(0).cumsum(-1), torch.randn(127, 64).bfloat16()),
        # along a dim whose elements are far apart: lanes take adjacent rows (no shuffles)
        (lambda x: (x.cumsum(0), x.flip(1).logcumsumexp(1).flip(1)), torch.randn(70, 3, 100).bfloat16()),
        (lambda x: x.cumsum(0) - 1, torch.randint(0, 2, (300, 33))),
        (lambda x: (x.cummin(0).values, x.double().cummax(0).values), torch.randn(300, 33).half()),
    ]
    first_columns = 15
    sources, by_case = [], {}
    for i, (fn, x) in enumerate(cases):
        report = ember.explain(fn, x, target="cuda")
        assert report.kernels and not report.fallbacks
        for k in report.kernels:
            columns = "strategy: scan columns" in k.source
            assert "strategy: scan" in k.source and (columns or re.search(r"ember_(block_scan|warp_scan)<", k.source))
            assert columns or i < first_columns, k.source
            sources.append(re.sub(rf"\b{re.escape(k.name)}(?=(_body|_i64)?\b)", f"{k.name}_{i}", k.source))
            by_case[i] = by_case.get(i, "") + k.source
    # sums of narrow rows are scanned across the warp; costlier combines through shared memory
    assert "ember_runs_" not in sources[0] and "ember_warp_scan<float>(ember_in" in sources[0]
    # where rows are aligned, a lane's group of consecutive elements loads at once; not reversed
    assert "ember_load_vec<unsigned short, 8>" in by_case[2] and "ember_load_vec" not in by_case[5]
    assert "ember_load_vec<unsigned short, 8>" in by_case[14]
    assert any("ember_runs_" in s and "EmberScanLogsumexp" in s for s in sources)
    path = tmp_path / "scans.cu"
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(sources) + "\n")
    for wide in ([], ["-DEMBER_WIDE_INDEX"]):
        proc = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", *wide, "-o",
                               str(tmp_path / "scans.cubin"), str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.parametrize("keepdim", [True, False])
def test_a_column_sum_the_shape_of_a_scan_it_reads(keepdim):
    # (CPU fuzz seed 381017672450, bool programs) a sum over rows with keepdim has the shape of
    # the (1, n) cumsum its gather reads: planned as the scan's kernel, whose one loop cannot
    # accumulate, it asked for a buffer it had (the graph's output) and planning stopped; the
    # graph ran through ATen with ember's warning
    def fn(x, mask):
        v = x * 2
        return (torch.gather(v, -1, mask.long().cumsum(-1)) + v).sum(dim=-2, keepdim=keepdim)

    mask = torch.zeros(1, 1000, dtype=torch.bool)
    mask[0, ::7] = True
    mask[0, 0] = False
    check(fn, torch.randn(4, 1000), mask)
