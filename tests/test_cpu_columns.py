"""CPU row kernels in column tiles (codegen/cpp_columns.py): reductions whose loads step along the
columns run with the rows loop outside and SIMD lanes on columns. Each case against eager, the
source read for the layout it took."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import check


def cpu_sources(report: ember.Report) -> list[str]:
    return [k.source for k in report.kernels if k.backend == "cpp"]


def in_columns(report: ember.Report) -> bool:
    return any("// columns:" in s for s in cpu_sources(report))


@pytest.mark.parametrize("shape", [(2, 7, 300), (3, 1, 513), (1, 40, 5), (2, 0, 9), (4, 6, 1), (2, 3, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int32])
def test_middle_dim_sums(shape, dtype):
    x = (torch.randn(shape) * 4).to(dtype)
    report = check(lambda x: (x.sum(1), x.amax(1) if x.shape[1] else x.sum(1) * 2), x)
    if shape[1] > 1 and shape[2] > 1:
        assert in_columns(report)


def test_several_loops_nan_and_arg_reductions():
    """Softmax (three loops: a kept max and sum between them), argmax, var, a NaN in one column."""
    x = torch.randn(3, 50, 300)
    x[0, 3, 7] = float("nan")
    x[1, :, 11] = float("-inf")

    def f(x):
        return torch.softmax(x, 1), x.argmax(1), x.amax(1) + x.var(1), x.argmin(1)

    report = check(f, x)
    assert in_columns(report)


def test_non_contiguous_and_broadcast_operands():
    x = torch.randn(4, 300, 20).transpose(1, 2)  # (4, 20, 300): columns strided
    b = torch.randn(300)
    w = torch.randn(20, 1)

    def f(x, b, w):
        return (x * w + b).sum(1), ((x - b) ** 2).mean(1, keepdim=True)

    check(f, x, b, w)
    y = torch.randn(5, 33, 270)
    report = check(lambda y, b: (y * b[:270]).sum(1) + b[:270], y, torch.randn(300))
    assert in_columns(report)


def test_symbolic_sizes_no_recompile():
    compiled = ember.compile(lambda x: x.sum(1) * 2, dynamic=True)
    for shape in [(2, 9, 300), (3, 5, 700), (1, 1, 1), (2, 0, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), x.sum(1) * 2)


def test_segment_bags_in_columns():
    """embedding_bag's segment kernel: the bag's indices read once per row of the bag, its rows'
    columns across the lanes."""
    w = torch.randn(100, 300)
    idx = torch.randint(0, 100, (50,))
    off = torch.tensor([0, 0, 7, 30, 31])
    psw = torch.randn(50)

    def f(w, idx, off, psw):
        return F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw)

    report = check(f, w, idx, off, psw, options={"cpu_embedding_bag": True})
    (source,) = [s for s in cpu_sources(report) if "segment_reduce" in s]
    assert "// columns:" in source
    loop = source[source.index("// loop 1"):]
    # the index is read (and checked) in the row loop, outside the columns' simd loop
    assert loop.index("ember_check_index") < loop.index("#pragma omp simd")


def test_rows_kernels_keep_their_layout():
    """A reduction along the last dim stays a row kernel (lanes along the row)."""
    report = check(lambda x: torch.softmax(x, -1), torch.randn(8, 300))
    assert not in_columns(report)


def test_reductions_of_outer_values():
    """A reduction whose source is an outer value of an earlier stage (a max broadcast down the
    rows and summed; every load of a length-0 row folded to a constant) reads it back from its
    tile array in the columns' loop (it was undeclared there: the kernel failed to build)."""
    def f(x):
        return (x.amax(1, keepdim=True).expand_as(x) * x.amin(1, keepdim=True)).sum(1)

    assert in_columns(check(f, torch.randn(3, 40, 300)))
    check(lambda x: (x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True) + 1).sqrt(), torch.randn(2, 0, 5))


def test_tile_width_follows_the_bytes_of_its_arrays():
    # one float64 accumulator a column: tiles of MAX_TILE columns (8 KiB); three (two float64
    # sums, each with its float block sum, and a float max: 28 bytes a column): as many as
    # TILE_BYTES hold, a multiple of 16.
    # Widths past a tile and between tiles, against eager
    from ember.codegen.cpp_columns import MAX_TILE, TILE_BYTES

    for width in (MAX_TILE + 37, 2 * MAX_TILE + 16):
        x = torch.randn(3, 40, width)
        one = cpu_sources(check(lambda x: x.sum(1), x))
        assert any(f"takes up to {MAX_TILE} adjacent" in s for s in one), one
        three = cpu_sources(check(lambda x: (x.sum(1), (x * x).sum(1), x.amax(1)), x))
        assert any(f"takes up to {TILE_BYTES // 28 // 16 * 16} adjacent" in s for s in three), three
    check(lambda x: x.sum(0), torch.randn(70, 3000))  # one row of tiles, shared by the threads
