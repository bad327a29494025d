"""Index simplification by the loops' extents and the C++ backend's split of a last loop read
through quotients and remainders (schedule/loops.py: simplify_with_ranges,
split_inner_by_divisor), in pointwise and row kernels: kernels in, kernels out; then programs
against eager."""

from __future__ import annotations

import dataclasses
import re

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

import ember
from ember.ir import dtypes as dt
from ember.ir.ops import Op
from ember.schedule.kernel_ir import Access, Kernel, ReduceArg, Value, inner_var, outer_var
from ember.schedule.loops import simplify_with_ranges, split_inner_by_divisor

o0, o1, o2, o3 = (outer_var(i) for i in range(4))


def _copy(outer: tuple, load: sympy.Expr, store: sympy.Expr) -> Kernel:
    x = Value("load", dt.float32, arg=Access("x", load))
    y = Value("store", dt.float32, (x,), Access("y", store))
    return Kernel("k", [], [], tuple(sympy.sympify(n) for n in outer), (), [x, y])


def _indices(kernel: Kernel) -> tuple[sympy.Expr, sympy.Expr]:
    return tuple(sympy.expand(v.arg.index) for v in kernel.values)


def test_heads_merged_into_rows_split_the_last_loop_at_the_head_size():
    # (B=8, H=4, T=64, D=64) heads read as (T*B, H*D) rows: o1 // 64 picks the head, o1 % 64 the lane
    rows = 64 * FloorDiv(o0, 8) + 16384 * ModularIndexing(o0, 1, 8)
    heads = rows + 4096 * FloorDiv(o1, 64) + ModularIndexing(o1, 1, 64)
    split = split_inner_by_divisor(_copy((512, 256), heads, 256 * o0 + o1))
    assert split.outer == (512, 4, 64)
    assert _indices(split) == (sympy.expand(rows + 4096 * o1 + o2), 256 * o0 + 64 * o1 + o2)


def test_a_remainder_of_a_remainder_and_a_cats_clamp_split_too():
    # the second of three 512-wide pieces side by side, each (T*B, H*D) heads: read at
    # clamp(o1 - 512) into [0, 512), then that position's head (// 64) and lane (% 64)
    local = sympy.Max(0, sympy.Min(o1 - 512, 511))
    load = 4096 * FloorDiv(local, 64) + ModularIndexing(local, 1, 64) + 32768 * o0
    split = split_inner_by_divisor(_copy((8, 1536), load, 1536 * o0 + o1))
    assert split.outer == (8, 24, 64)
    expected = sympy.expand(4096 * ModularIndexing(o1, 1, 8) + o2 + 32768 * o0)
    assert _indices(split) == (expected, 1536 * o0 + 64 * o1 + o2)


@pytest.mark.parametrize("outer, load", [
    ((16, 200), FloorDiv(o1, 64) + ModularIndexing(o1, 1, 64)),     # 64 does not divide 200
    ((16, 96), FloorDiv(o1, 8) * 100 + ModularIndexing(o1, 1, 8)),  # 8 lanes: too short a loop
    ((16, 768), FloorDiv(o1, 64) + ModularIndexing(o1, 1, 48)),     # 64 is no multiple of 48
    ((16, 256), FloorDiv(3 * o1, 64)),                              # not o plus multiples of 64
    ((16, 256), FloorDiv(o1 + 3, 64)),
    ((16, sympy.Symbol("s0", positive=True, integer=True)), FloorDiv(o1, 64)),  # a symbolic extent
])
def test_no_split_where_it_would_not_make_the_last_loop_linear(outer, load):
    kernel = _copy(outer, load, outer[1] * o0 + o1 if isinstance(outer[1], int) else o1)
    assert split_inner_by_divisor(kernel) is kernel


def _column_sum(outer: tuple, rows: int, load: sympy.Expr, **kernel_fields) -> Kernel:
    """sum over ``rows`` of x read at ``load`` (r0 the row), stored at the last outer index."""
    x = Value("load", dt.float32, arg=Access("x", load), inner=True)
    total = Value("reduce", dt.float32, (x,), ReduceArg(Op.SUM, inner_var(0)), loop=1)
    y = Value("store", dt.float32, (total,), Access("y", outer_var(len(outer) - 1)), stage=1)
    return Kernel("k", [], [], tuple(sympy.sympify(n) for n in outer), (sympy.Integer(rows),), [x, total, y],
                  **kernel_fields)


def test_a_row_kernels_columns_split_at_the_head_size():
    # a bias gradient: the column sums of (B=2, H=4, T=32, D=64) heads read as (T*B, H*D) rows
    r0 = inner_var(0)
    rows = 64 * ModularIndexing(r0, 1, 32) + 8192 * FloorDiv(r0, 32)
    heads = 2048 * FloorDiv(o0, 64) + ModularIndexing(o0, 1, 64) + rows
    split = split_inner_by_divisor(_column_sum((256,), 64, heads))
    assert split.outer == (4, 64) and split.inner == (64,)
    load, store = (v.arg.index for v in split.values if v.kind in ("load", "store"))
    assert sympy.expand(load) == sympy.expand(2048 * o0 + o1 + rows) and store == 64 * o0 + o1
    # (a kernel that also reduces over all rows keeps its loops: its programs combine in order)
    total = Value("rowreduce", dt.float32, (split.values[1],), ReduceArg(Op.SUM, 0), stage=1)
    kernel = _column_sum((256,), 64, heads)
    kernel = dataclasses.replace(kernel, values=[*kernel.values, total])
    assert split_inner_by_divisor(kernel) is kernel


def test_quotients_and_remainders_the_extents_decide_are_folded():
    # a head's columns 64*h + d (h < 4, d < 64) of a 256-wide row: (64h + d) // 256 is 0
    col = 64 * o1 + o3
    kernel = _copy((8, 4, 64, 64), 768 * o0 + 768 * FloorDiv(col, 256) + ModularIndexing(col, 1, 256) + 6144 * o2,
                   2048 * o2 + 256 * o0 + col)
    assert _indices(simplify_with_ranges(kernel))[0] == 768 * o0 + 64 * o1 + o3 + 6144 * o2
    unknown = _copy((8, sympy.Symbol("s0", positive=True, integer=True)), FloorDiv(o1, 256), o1)
    assert simplify_with_ranges(unknown) is unknown


def merge_heads(x):
    b, h, t, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(t * b, h * d)


def _source(fn, *args) -> str:
    return "\n".join(k.source for k in ember.explain(fn, *args).kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("shape", [(8, 4, 16, 64), (3, 2, 1, 32), (1, 5, 7, 16), (0, 4, 8, 64)])
def test_merged_heads_match_eager(dtype, shape):
    x = (torch.randn(shape) * 100).to(dtype)
    assert torch.equal(ember.compile(merge_heads, dynamic=False)(x), merge_heads(x))
    if shape == (8, 4, 16, 64):
        assert "/ 64" not in _source(merge_heads, x) and "% 64" not in _source(merge_heads, x)


def test_heads_joined_side_by_side_match_eager_and_read_as_vectors():
    def join(q, k, v, w):
        return torch.cat([merge_heads(q), merge_heads(k), merge_heads(v), w], 1)

    q, k, v = (torch.randn(4, 4, 8, 32) for _ in range(3))
    for w in (torch.randn(32, 128), torch.randn(32, 96), torch.randn(128, 32).t()):  # 96: no multiple of 128
        assert torch.equal(ember.compile(join, dynamic=False)(q, k, v, w), join(q, k, v, w))
    source = _source(join, q, k, v, torch.randn(32, 128))
    # split at the head size 32; its reads neither clamped nor divided
    reads = [i for i in re.findall(r"\w\[([^\]\n]*)\]", source) if "o2" in i]
    assert "o2 < 32" in source and reads and all(i.endswith(" + o2") and i.count("o2") == 1 for i in reads), reads


def test_pads_rotations_and_symbolic_rows_match_eager():
    def rotate_half(x):
        a, b = x.chunk(2, -1)
        return torch.cat((-b, a), -1) * 2 + x

    def pad_both(x):
        return F.pad(x.transpose(1, 2), (32, 32), value=-1.0)

    x = torch.randn(6, 3, 20, 64)
    for fn in (rotate_half, pad_both):
        assert torch.equal(ember.compile(fn, dynamic=False)(x), fn(x))
        compiled = ember.compile(fn, dynamic=True)  # (the rows symbolic, the last loop's extent not)
        for rows in (5, 9, 2):
            y = torch.randn(rows, 3, 20, 128)[..., ::2]  # (strided)
            assert torch.equal(compiled(y), fn(y))
    assert torch.equal(ember.compile(merge_heads, dynamic=True)(x.transpose(2, 3)), merge_heads(x.transpose(2, 3)))


def qkv_bias_grad(q, k, v):
    """nn.MultiheadAttention's in-projection gradient: q, k, v's heads joined, and its bias's."""
    g = torch.cat([merge_heads(q), merge_heads(k), merge_heads(v)], 1)
    return g, g.sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(16, 2, 4, 64), (1, 1, 1, 16), (5, 3, 2, 32), (0, 2, 4, 64)])
def test_heads_joined_and_their_column_sums_match_eager(dtype, shape):
    q, k, v = (torch.randn(shape).to(dtype) for _ in range(3))
    out = ember.compile(qkv_bias_grad, dynamic=False)(q, k, v)
    ref = qkv_bias_grad(q, k, v)
    assert torch.equal(out[0], ref[0])
    torch.testing.assert_close(out[1], ref[1], **({"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}))
    if shape == (16, 2, 4, 64) and dtype == torch.float32:
        source = _source(qkv_bias_grad, q, k, v)
        assert "outer [6, 64]" in source and "/ 64" not in source and "% 64" not in source, source


def test_joined_heads_column_sums_with_symbolic_rows_and_strided_inputs_match_eager():
    compiled = ember.compile(qkv_bias_grad, dynamic=True)
    for t in (8, 3, 17):
        q, k, v = (torch.randn(2, 4, t, 64).transpose(1, 2).contiguous().transpose(1, 2) for _ in range(3))
        out, ref = compiled(q, k, v), qkv_bias_grad(q, k, v)
        assert torch.equal(out[0], ref[0])
        torch.testing.assert_close(out[1], ref[1])
