"""The CPU backend's float32 sums add up in float over blocks of SUM_BLOCK elements (8 to an AVX
vector, not 4 doubles), each block's sum then into a double (codegen/cpp.py: _open_block; column
tiles' sums over blocks of rows, codegen/cpp_columns.py): read in the kernel source, and checked
against eager and against float64."""

from __future__ import annotations

import pytest
import torch

import ember
from ember.codegen.cpp import SUM_BLOCK
from ember.codegen.cpp_columns import ROW_BLOCK

from .helpers import assert_same, check


def _source(report) -> str:
    return "\n".join(k.source for k in report.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [7, SUM_BLOCK, SUM_BLOCK + 1, 3000])
def test_row_sums_add_in_float_blocks(dtype, width):
    x = torch.randn(5, width, dtype=dtype) + 0.25
    source = _source(check(lambda x: x.sum(-1) * x.amax(-1), x))
    assert "_part = 0.0f;" in source, source
    assert (f"r0_block += {SUM_BLOCK}" in source) == (width > SUM_BLOCK), source


def test_float64_sums_and_non_sums_keep_their_accumulators():
    source = _source(check(lambda x: x.sum(-1), torch.randn(5, 300, dtype=torch.float64)))
    assert "_part" not in source
    source = _source(check(lambda x: x.amax(-1) + x.prod(-1), torch.rand(5, 300) + 0.5))
    assert "_part" not in source


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (1, 1), (4, 1), (1, 2000)])
def test_awkward_shapes(shape):
    check(lambda x: x.sum(-1), torch.randn(shape))
    check(lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), torch.randn(shape))


def test_symbolic_rows_run_in_blocks():
    for width in (5, 19, 2500):
        report = check(lambda x: torch.softmax(x, -1) * x.sum(-1, keepdim=True), torch.randn(3, width), dynamic=True)
    assert f"r0_block += {SUM_BLOCK}" in _source(report)


def test_non_contiguous_sums_over_several_dims():
    x = torch.randn(6, 50, 40).permute(0, 2, 1)
    check(lambda x: x.sum((1, 2)), x)
    check(lambda x: (x * x).mean((0, 2)), x)


def test_a_whole_tensor_sum_shares_its_blocks_among_the_threads():
    x = torch.randn(100_003)
    source = _source(check(lambda x: x.sum() + x.amax(), x))
    assert "#pragma omp for schedule(static) nowait\n      for (int64_t r0_block = 0;" in source
    assert f"r0_block += {SUM_BLOCK}" in source
    assert "combined in thread order" in source and "reduction(+:acc1)" not in source


def test_exact_reductions_keep_openmps_clause():
    # integer sums and arg reductions combine exactly in any order: no arrays of shares
    source = _source(check(lambda x: (x.sum(), x.argmax()), torch.randint(-9, 9, (100_003,))))
    assert "thread order" not in source and "#pragma omp parallel for" in source


@pytest.fixture
def many_threads():
    # more threads than cores: they finish in varying order, as on a many-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("fn", [lambda x: x.amax(), lambda x: x.amin(), lambda x: x.sum(),
                                lambda x: (x * 2).amax(-1).amax(), lambda x: (x * x).sum(-1).sum()],
                         ids=["amax", "amin", "sum", "across-rows-amax", "across-rows-sum"])
def test_reductions_over_threads_give_the_same_result_every_call(fn, many_threads):
    # a float reduction's threads combine in thread order (codegen/cpp_team.py): OpenMP's own
    # combined them as they finished, and a max over zeros of both signs gave 0.0 or -0.0
    torch.manual_seed(0)
    zeros = torch.zeros(300, 400)
    zeros[torch.rand(300, 400) < 0.5] = -0.0
    wide = torch.randn(300, 400, dtype=torch.float64) * torch.logspace(-8, 8, 400, dtype=torch.float64)
    for x in (zeros, wide):
        compiled = ember.compile(fn)
        results = {compiled(x).item().hex() for _ in range(40)}
        assert len(results) == 1, results
        assert_same(compiled(x), fn(x), rtol=1e-12 if x.dtype == torch.float64 else None)


@pytest.mark.parametrize("dims", [-1, None], ids=["row", "whole"])
def test_blocks_bound_the_rounding(dims):
    # 4M positive floats: a float accumulator per vector lane over the whole row reaches 2^18 and
    # loses ~1e-6 of the total; in blocks only the result's rounding (3e-8) is left
    x = torch.rand(1, 1 << 22)
    check(lambda x: x.sum(dims), x)
    got = ember.compile(lambda x: x.sum(dims))(x).double()
    exact = x.double().sum(dims)
    assert ((got - exact).abs() / exact).max() < 2e-7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [2, 7, ROW_BLOCK, ROW_BLOCK + 1, 3000])
def test_column_sums_add_in_float_blocks_of_rows(dtype, rows):
    x = torch.randn(rows, 40, dtype=dtype) + 0.25
    source = _source(check(lambda x: (x.sum(0), x.amax(0)), x))
    assert "// columns:" in source and "_p[o0 - ember_c0] = 0.0f;" in source, source
    assert (f"r0_block += {ROW_BLOCK}" in source) == (rows > ROW_BLOCK), source


def test_column_sums_over_several_dims_and_strides():
    # dims that merge into one run of rows (a block may span both), and ones that do not
    # (positive values: sums of thousands of randn cancel, and eager's own rounding then shows)
    check(lambda x: x.sum((0, 1)), torch.rand(40, 60, 24))
    check(lambda x: x.sum((0, 1)), torch.rand(60, 40, 24).transpose(0, 1))
    check(lambda x: x.sum(0), torch.rand(24, 1500, 3).permute(1, 2, 0))


def test_symbolic_column_sums_run_in_blocks():
    compiled = ember.compile(lambda x: x.sum(0) * 2, dynamic=True)
    for rows in (3, 0, 2500, 1):
        x = torch.rand(rows, 33)
        torch.testing.assert_close(compiled(x), x.sum(0) * 2)


def test_column_blocks_bound_the_rounding():
    # 4M positive floats down 16 columns: blocks of ROW_BLOCK rows leave only the result's rounding
    x = torch.rand(1 << 18, 16)
    got = ember.compile(lambda x: x.sum(0))(x).double()
    exact = x.double().sum(0)
    assert ((got - exact).abs() / exact).max() < 2e-7


def test_a_whole_tensor_product_runs_each_threads_share_in_one_simd_loop():
    # blocks of 1024 restarting the lanes at 1 took a float32 product of values near 1 to 8x
    # eager's error, always too small (a helper's hunt); each thread's share is one loop again
    torch.manual_seed(0)
    y = 1 + 1e-4 * torch.randn(1 << 20)
    exact = y.double().prod().item()
    report = check(lambda y: y.prod(), y, rtol=1e-2)
    assert "ember_lo; r0 < ember_hi" in _source(report)
    got = ember.compile(lambda y: y.prod())(y).item()
    assert abs(got / exact - 1) <= 1.5 * abs(y.prod().item() / exact - 1)


def test_search_hints_are_each_threads_own_in_a_team():
    # (the team's parallel region shared one hint among its threads: a data race)
    b, x = torch.linspace(-3, 3, 1000), torch.randn(100_003)
    report = check(lambda x: (torch.searchsorted(b, x) * 0.5).sum(), x)
    assert "firstprivate(v1_hint) if(" in _source(report)
