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

from .helpers import check


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
    assert "#pragma omp parallel for schedule(static) reduction(+:" in source
    assert f"r0_block += {SUM_BLOCK}" in source


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
