"""CPU row kernels in column tiles (codegen/cpp_columns.py): reductions whose loads step along the
columns run with the rows loop outside and SIMD lanes on columns. Each case against eager, the
source read for the layout it took."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import assert_clean, assert_same, check, compile_checked


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


@pytest.fixture
def threads():
    """Sets torch's (and so the kernels' OpenMP) thread count for a test; restores it after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def in_runs(report: ember.Report) -> bool:
    return any("// runs:" in s for s in cpu_sources(report))


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32])
def test_runs_of_rows_share_a_tile(threads, n_threads, dtype):
    """Fewer tiles than threads: the threads share each tile's rows (runs), combined in run order.
    Rows not a whole number of runs or blocks; a NaN and an infinity in two columns."""
    threads(n_threads)
    x = (torch.randint(-40, 40, (4133, 67)) / 4).to(dtype)  # (sums exact in any order)
    if dtype.is_floating_point:
        x[100, 5], x[4000, 9] = float("nan"), float("inf")

    def f(x):
        out = (x.sum(0), x.amax(0), x.amin(0), (x > 0).any(0), (x > -20).all(0))
        return out + ((x.float() / 4).mean(0), (1 + x.float() / 1e3).prod(0)) if dtype.is_floating_point else out

    report = check(f, x)
    assert in_runs(report)
    compiled = ember.compile(f)
    first, again = compiled(x), compiled(x)
    for a, b in zip(first, again):  # (the same bits every call)
        assert torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("shape, dim", [((2, 3000, 40), 1), ((2, 3, 3000, 20), 2), ((5000, 2, 3), 0),
                                        ((40, 1100), 0), ((3, 0, 40), 1)])
def test_runs_with_leading_dims_and_narrow_tiles(threads, shape, dim):
    """Runs beside leading outer dims (each run keeps [run][leading dims][column]), tiles narrowed
    for the threads the runs leave idle, too few rows for a second run, no rows."""
    threads(8)
    x = torch.randint(-40, 40, shape) / 4
    check(lambda x: (x.sum(dim), x.amax(dim) if x.shape[dim] else x.sum(dim)), x)


def test_runs_with_symbolic_sizes_and_a_store(threads):
    """One artifact for every shape, runs decided at run time; a kernel that also writes the
    elements it sums (each run writes its own rows)."""
    threads(4)

    def f(x):
        y = x * 2 + 1
        return y, y.sum(0)

    compiled, report = compile_checked(f, dynamic=True)
    for shape in [(3000, 70), (50, 2000), (9000, 5), (1, 300), (0, 7)]:
        x = torch.randint(-40, 40, shape) / 4
        assert_same(compiled(x), f(x))
    assert in_runs(report)
    assert_clean(report)


def test_runs_only_where_they_combine():
    """An arg reduction keeps one thread on a tile's rows (its pair would need the first position
    among equal values); reductions that combine run in runs, loop after loop (a softmax down the
    columns)."""
    x = torch.randn(4000, 64)
    assert not in_runs(check(lambda x: x.argmax(0), x))
    assert in_runs(check(lambda x: x.sum(0), x))
    assert in_runs(check(lambda x: torch.softmax(x, 0), x))


@pytest.mark.parametrize("n_threads", [1, 2, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_runs_loop_after_loop(threads, n_threads, dtype):
    """A kernel of several loops over few columns (a channels_last BatchNorm's statistics, then
    its normalized rows; a softmax down the columns; values kept between stages: a weight per
    column) takes each loop in runs: the runs' accumulators combined in run order before the
    next loop, whose runs redo the stages before it. Rows not a whole number of runs or blocks,
    a NaN in one column; the same bits every call."""
    threads(n_threads)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4133, 24, generator=gen).to(dtype)
    x[1000, 3] = float("nan")
    w, b = torch.randn(24, generator=gen).to(dtype), torch.randn(24, generator=gen).to(dtype)

    def f(x, w, b):
        mean = x.float().mean(0)
        centred = x.float() - mean
        var = (centred * centred).mean(0)
        y = (centred * torch.rsqrt(var + 1e-5) * w + b).to(x.dtype)
        return y, var, torch.softmax(x.float() * w, 0).to(x.dtype), (x > 0).any(0)

    report = check(f, x, w, b)
    assert any("// loop 2 over each run's rows" in s for s in cpu_sources(report))  # (runs: at run time)
    compiled = ember.compile(f)
    first, again = compiled(x, w, b), compiled(x, w, b)
    for a, c in zip(first, again):
        assert torch.equal(a.nan_to_num(), c.nan_to_num()) and torch.equal(a.isnan(), c.isnan())


def test_channels_last_batch_norm_gradients_in_runs(threads):
    """A 16-channel channels_last BatchNorm's backward (its statistics' gradients, then the
    input's) in runs of rows: one tile was all of a row, so one thread did all of it. Its
    gradient to the residual branch is laid out channels_last, as its inputs, so the kernel's
    rows are one loop (buffer_layouts.py)."""
    threads(2)
    gen = torch.Generator().manual_seed(0)
    bn = torch.nn.BatchNorm2d(16)
    x = torch.randn(4, 16, 12, 12, generator=gen).to(memory_format=torch.channels_last).requires_grad_()
    skip = torch.randn(4, 16, 12, 12, generator=gen).to(memory_format=torch.channels_last).requires_grad_()

    def f(x, skip):
        return torch.relu(bn(x) + skip).relu()

    report = ember.Report()
    compiled = ember.compile(f, report=report)
    up = torch.randn(4, 16, 12, 12, generator=gen).to(memory_format=torch.channels_last)
    got = torch.autograd.grad(compiled(x, skip), [x, skip, bn.weight, bn.bias], up)
    want = torch.autograd.grad(f(x, skip), [x, skip, bn.weight, bn.bias], up)
    assert_same(got, want)
    backward = [k.source for g in report.graphs if g.kind == "backward" for k in g.kernels]
    assert any("// runs:" in s and "// loop 2 over each run's rows" in s for s in backward), backward
    wrappers = "".join(g.wrapper for g in report.graphs)
    assert "(2304, 1, 192, 16)" in wrappers and "(2304, 144, 12, 1)" not in wrappers, wrappers


def test_dense_strides_in_the_order_of_an_operand():
    from ember.schedule.buffer_layouts import dense_in_order_of

    assert dense_in_order_of((4, 16, 12, 12), (2304, 1, 192, 16)) == (2304, 1, 192, 16)  # channels_last
    assert dense_in_order_of((4, 16, 12, 12), (2304, 144, 12, 1)) is None                # contiguous
    assert dense_in_order_of((5, 3), (1, 5)) == (1, 5)                                    # transposed
    # size-1 dims keep their place: (n, c, 1, 1) of a channels_last pooling, contiguous as it lies
    assert dense_in_order_of((4, 16, 1, 1), (16, 1, 16, 16)) is None
    assert dense_in_order_of((4, 1, 12, 12), (144, 144, 12, 1)) is None
    assert dense_in_order_of((4, 16, 1, 12), (192, 1, 192, 16)) == (192, 1, 192, 16)
    import sympy
    s = sympy.Symbol("s0", integer=True, positive=True)
    assert dense_in_order_of((4, 16, s, s), (16 * s * s, 1, 16 * s, 16)) is None         # symbolic: unknown


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 15, 16, 17, 33, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32])
def test_rows_four_at_a_time(rows, dtype):
    """A column loop that reduces takes ROW_UNROLL rows a simd loop (each column's accumulators
    read and written once for them), the rows left over one at a time: row counts around
    multiples of 4 and of a block, several reductions, a NaN, a store in the same loop; float16
    loops, converted a strip at a time, one row at a time."""
    x = (torch.randint(-40, 40, (rows, 37)) / 4).to(dtype)
    if dtype.is_floating_point:
        x[rows // 2, 3] = float("nan")

    def f(x):
        y = x * 2
        return y, y.sum(0), x.amax(0), (x > 1).any(0), (x < 9).all(0)

    sources = cpu_sources(check(f, x))
    assert any("// each column, 4 rows" in s for s in sources) == (dtype != torch.float16 and rows >= 4), sources


def test_rows_four_at_a_time_with_symbolic_rows():
    def f(x):
        return x.sum(0), x.amax(0), (x * x).sum(0)

    compiled, report = compile_checked(f, dynamic=True)
    for rows in (130, 3, 4, 9, 1):
        x = torch.randint(-40, 40, (rows, 50)) / 4
        assert_same(compiled(x), f(x))
    assert any("// each column, 4 rows" in s for s in cpu_sources(report))
    assert_clean(report)


def test_any_beside_16_bit_values_leaves_the_column_loops_vectorized(tmp_path):
    """An any's accumulators kept in a bool array left a bfloat16 column loop scalar (GCC 12, "no
    vectype"); they are kept as bytes (cpp_columns.py: _acc_array_type)."""
    from .test_half_cpu import _loops_left_scalar

    x = torch.randn(512, 256).to(torch.bfloat16)
    report = check(lambda x, w: ((x * w).sum(0), x.sum(0), (x > 0).any(0)), x, torch.randn(256).to(torch.bfloat16))
    (kernel,) = report.kernels
    assert "uint8_t acc" in kernel.source and "// each column, 4 rows" in kernel.source, kernel.source
    assert not _loops_left_scalar([kernel], tmp_path)
