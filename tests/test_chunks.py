"""Column sums computed by the row kernel beside them (passes/chunks.py, Op.CHUNK_SUM, chunked row
kernels): the rewrite, the op's meaning, fusion into norm backward kernels on every backend, and
gradients against eager."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.analysis.reference import chunk_sum
from ember.config import Config
from ember.ir import GraphBuilder, Op, dtypes, structurally_equal, verify
from ember.passes.chunks import chunk_column_sums, chunk_count
from ember.passes.pipeline import pipeline_for

from .conftest import INTERPRETED_TRITON
from .helpers import assert_same
from .test_cuda import compile_batches, needs_nvcc, sources


def rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def norm_backward_graph(rows, width=16):
    """dx's row sum and dw's column sum of one product, as a norm's backward has them."""
    b = GraphBuilder()
    x, dy = b.input((rows, width)), b.input((rows, width))
    prod = b.mul(x, dy)
    return b, x, dy, prod


# ---- the rewrite --------------------------------------------------------------------------

def test_column_sum_beside_a_row_sum_becomes_a_sum_of_chunk_sums():
    b, x, dy, prod = norm_backward_graph(64)
    before = b.build(b.reduce(Op.SUM, prod, [1]), b.reduce(Op.SUM, prod, [0]))
    verify(before)
    after = chunk_column_sums(before, chunks=8)
    verify(after)
    e = GraphBuilder()
    x, dy = e.input((64, 16)), e.input((64, 16))
    prod = e.mul(x, dy)
    parts = e.op(Op.CHUNK_SUM, prod, arg=(1, 8), dtype=dtypes.float64)  # (a CPU graph's partials)
    expected = e.build(e.reduce(Op.SUM, prod, [1]), e.cast(e.reduce(Op.SUM, parts, [0]), dtypes.float32))
    assert structurally_equal(after, expected), f"got:\n{after}\n\nexpected:\n{expected}"


@pytest.mark.parametrize("device,dtype,acc", [("cuda", dtypes.bfloat16, dtypes.float32),
                                              ("cpu", dtypes.bfloat16, dtypes.float64),
                                              ("cpu", dtypes.float32, dtypes.float64)])
def test_partials_are_wide_and_the_total_is_cast_back(device, dtype, acc):
    # 16-bit partials are float32; on the CPU, float32 ones are double, as its sums accumulate
    b = GraphBuilder(device=device)
    x = b.input((40, 8), dtype)
    before = b.build(b.reduce(Op.SUM, x, [1]), b.reduce(Op.SUM, x, [0]))
    after = chunk_column_sums(before, chunks=4)
    parts = [n for n in after.nodes if n.op is Op.CHUNK_SUM]
    assert [(p.dtype, tuple(p.shape)) for p in parts] == [(acc, (4, 8))]
    assert after.outputs[1].op is Op.CAST and after.outputs[1].dtype == dtype


@pytest.mark.parametrize("case", ["no row sum", "other inputs", "too few rows", "off", "middle dim",
                                  "row sum reads it", "read beside a row max"])
def test_column_sums_left_alone(case):
    b, x, dy, prod = norm_backward_graph(64 if case != "too few rows" else 10, 64 if "beside" in case else 16)
    if case == "row sum reads it":  # (its kernel needs the column sum whole: no chunk sum can join it)
        column = b.reduce(Op.SUM, prod, [0])
        before = b.build(b.reduce(Op.SUM, b.sub(prod, b.expand(column, (64, 16))), [1]), column)
    elif case == "read beside a row max":  # (a square's: one kernel would compute the add)
        columns = b.reshape(b.reduce(Op.SUM, prod, [0]), (64,))
        rows = b.reshape(b.reduce(Op.AMAX, prod, [1]), (64,))
        before = b.build(b.add(columns, rows), b.reduce(Op.SUM, prod, [1]))
    elif case == "no row sum":
        before = b.build(b.reduce(Op.SUM, prod, [0]))
    elif case == "other inputs":  # the row sum reads neither x nor dy
        z = b.input((64, 16))
        before = b.build(b.reduce(Op.SUM, b.exp(z), [1]), b.reduce(Op.SUM, prod, [0]))
    elif case == "middle dim":
        y = b.input((4, 16, 8))
        before = b.build(b.reduce(Op.SUM, y, [2]), b.reduce(Op.SUM, y, [1]))
    else:
        before = b.build(b.reduce(Op.SUM, prod, [1]), b.reduce(Op.SUM, prod, [0]))
    after = chunk_column_sums(before, chunks=0 if case == "off" else 8)
    assert not [n for n in after.nodes if n.op is Op.CHUNK_SUM]


def test_long_pointwise_chains_are_walked_without_recursion():
    b = GraphBuilder()
    x = b.input((64, 4))
    y = x
    for _ in range(3000):
        y = b.neg(y)
    after = chunk_column_sums(b.build(b.reduce(Op.SUM, x, [1]), b.reduce(Op.SUM, y, [0])), chunks=8)
    assert [n for n in after.nodes if n.op is Op.CHUNK_SUM]


def test_a_lone_column_sum_takes_more_runs_on_a_gpu():
    # RMSNorm's dw is the only column sum beside its row sums: twice the runs per SM of
    # LayerNorm's dw and db, whose row kernel keeps two columns' partials (passes/chunks.py)
    def graph(column_sums: int):
        b = GraphBuilder(device="cuda")
        x, dy = b.input((4096, 64), dtypes.bfloat16), b.input((4096, 64), dtypes.bfloat16)
        prod = b.mul(x, dy)
        sums = [b.reduce(Op.SUM, t, [0]) for t in (prod, dy)[:column_sums]]
        return b.build(b.reduce(Op.SUM, prod, [1]), *sums)

    one, two = graph(1), graph(2)

    def runs(graph, **kw):
        after = chunk_column_sums(graph, per_sm=2, per_sm_one_sum=4, **kw)
        return sorted(n.arg[1] for n in after.nodes if n.op is Op.CHUNK_SUM)

    sms = chunk_count("cuda", 1)
    assert runs(one) == [4 * sms] and runs(two) == [2 * sms, 2 * sms]
    assert runs(one, chunks=8) == [8]  # (a count the user set holds for every sum)
    assert sorted(n.arg[1] for n in chunk_column_sums(one, per_sm=2).nodes if n.op is Op.CHUNK_SUM) == [2 * sms]


def test_pipeline_places_the_rewrite_and_the_option():
    cfg = Config()
    assert "chunk_column_sums" in [name for name, _ in pipeline_for(cfg)]
    with pytest.raises(ValueError, match="row_chunks"):
        cfg.replace(row_chunks=-1)


@pytest.mark.parametrize("shape,lead,chunks", [((10, 3), 1, 4), ((7, 5, 3), 2, 4), ((3, 6), 1, 8), ((0, 4), 1, 3)])
def test_chunk_sum_meaning(shape, lead, chunks):
    x = torch.randn(shape, dtype=torch.float64)
    parts = chunk_sum(x, lead, chunks, dtypes.float64)
    assert parts.shape == (chunks, *shape[lead:])
    torch.testing.assert_close(parts.sum(0), x.sum(tuple(range(lead))))
    rows = x.reshape(-1, *shape[lead:])
    per = -(-rows.shape[0] // chunks)
    torch.testing.assert_close(parts[0], rows[:per].sum(0))


# ---- compiled: kernels and gradients ------------------------------------------------------

def grads(fn, inputs, grad, options=None, dynamic=None):
    """(ember's gradients, eager's, the report)."""
    report = ember.Report()
    compiled = ember.compile(fn, options=options, report=report, dynamic=dynamic)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    compiled(*leaves).backward(grad)
    ref = [t.detach().clone().requires_grad_() for t in inputs]
    fn(*ref).backward(grad)
    return [t.grad for t in leaves], [t.grad for t in ref], report


def chunked_sources(report):
    return [k.source for k in report.kernels if "ember_chunk" in k.source]


CASES = [  # (row_chunks 4 splits 16 rows or more: runs of 8, 5 (the last of 4), 6 (the last of 3), 9 (6) rows)
    ("rmsnorm fp32", rmsnorm, (32, 48), torch.float32),
    ("rmsnorm bf16 ragged runs", rmsnorm, (19, 50), torch.bfloat16),
    ("layer_norm 3-d", layer_norm, (3, 7, 40), torch.float32),
    ("layer_norm fp64", layer_norm, (33, 16), torch.float64),
]


@pytest.mark.parametrize("name,fn,shape,dtype", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("target", ["cpp", *(pytest.param(t, marks=INTERPRETED_TRITON)  # (CPU tensors)
                                    for t in ("triton", "triton-looped", "triton-4rows"))])
def test_norm_backward_sums_columns_in_its_row_kernel(name, fn, shape, dtype, target):
    torch.manual_seed(0)
    n_params = 1 if fn is rmsnorm else 2
    inputs = [torch.randn(shape, dtype=dtype)] + [torch.randn(shape[-1], dtype=dtype) for _ in range(n_params)]
    grad = torch.randn(shape, dtype=dtype)
    options = {"target": target.split("-")[0], "row_chunks": 4}  # (the default follows the thread count)
    if target == "triton-looped":
        options["triton_launch"] = {"PERSISTENT": False, "RBLOCK": 16}
    if target == "triton-4rows":  # whole rows, 4 at a time (the last block of a run partly masked)
        options["triton_launch"] = {"PERSISTENT": True, "XBLOCK": 4, "RBLOCK": 64, "num_warps": 4}
    got, ref, report = grads(fn, inputs, grad, options)
    # bfloat16: eager rounds each product to 16 bits before summing, ember does not; sums of 19
    # terms of magnitude ~10 that cancel differ by a few 16-bit ulps of the terms
    assert_same(got, ref, atol=0.05 if dtype == torch.bfloat16 else None)
    assert all(k.built for k in report.kernels)
    # the backward: the row kernel (dx, and every parameter's partial column sums), then the
    # partials' sum: no kernel reads x and dy a second time
    (backward,) = [g for g in report.graphs if g.kind == "backward"]
    assert len(backward.kernels) == 2, [k.name for k in backward.kernels]
    (row_kernel,) = [k for k in backward.kernels if "ember_chunk" in k.source]
    assert row_kernel.kernel_ir.count("= chunksum") == n_params
    assert " runs" in row_kernel.kernel_ir.splitlines()[1]


def test_symbolic_rows_need_no_recompile():
    torch.manual_seed(0)
    compiled = ember.compile(rmsnorm, dynamic=True)
    before = ember.stats()["graphs_compiled"]
    for rows in (40, 64, 23, 100):
        x = torch.randn(rows, 32, requires_grad=True)
        w = torch.randn(32, requires_grad=True)
        g = torch.randn(rows, 32)
        compiled(x, w).backward(g)
        gx, gw = x.grad, w.grad
        x.grad = w.grad = None
        rmsnorm(x, w).backward(g)
        assert_same((gx, gw), (x.grad, w.grad))
    assert ember.stats()["graphs_compiled"] - before == 2  # one forward, one backward


def test_column_sums_of_many_float32_rows_are_as_accurate_as_eager():
    # each of the 8 runs added its 2^17 rows into float32 partials: 1e-3 off (eager: 1e-6)
    x = torch.full((2**20, 4), 0.1)
    fn = lambda x: (x.sum(0), x.sum(1))  # noqa: E731
    report = ember.Report()
    got = ember.compile(fn, options={"row_chunks": 8}, report=report)(x)
    assert chunked_sources(report)
    exact = x.double().sum(0)
    assert ((got[0].double() - exact) / exact).abs().max().item() < 1e-6
    assert_same(got, fn(x))


def test_chunk_sums_on_their_own_with_fusion_off():
    """Without fusion every op has a kernel: a chunk sum reduces its runs in an inner loop,
    rows past the end masked (37 rows in 8 runs of 5; 3-d rows addressed through the flat row)."""
    torch.manual_seed(0)
    for shape in ((37, 24), (3, 13, 8)):
        inputs = [torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape[-1])]
        got, ref, report = grads(layer_norm, inputs, torch.randn(shape), {"fusion": False, "row_chunks": 8},
                                 dynamic=False)
        assert_same(got, ref)
        assert not chunked_sources(report)
        on_their_own = [k for k in report.kernels if f"outer [8, {shape[-1]}]" in k.kernel_ir]
        assert len(on_their_own) == 2, [k.kernel_ir.splitlines()[1] for k in report.kernels]  # dw and db


def test_row_chunks_option_sets_the_runs():
    torch.manual_seed(0)
    inputs = [torch.randn(64, 16), torch.randn(16)]
    got, ref, report = grads(rmsnorm, inputs, torch.randn(64, 16), {"row_chunks": 5})
    assert_same(got, ref)
    assert any("ember_chunk < 5" in s for s in chunked_sources(report))
    for off in (0, 1):  # (one run is one kernel's sums: its (1, W) partial failed to render)
        got, ref, report = grads(rmsnorm, inputs, torch.randn(64, 16), {"row_chunks": off})
        assert_same(got, ref)
        assert not chunked_sources(report) and not [g.error for g in report.graphs if g.error]


@needs_nvcc
def test_chunked_cuda_kernels_compile_for_sm90(tmp_path):
    kernels = []
    for i, (_name, fn, shape, dtype) in enumerate(CASES):
        n_params = 1 if fn is rmsnorm else 2
        inputs = [torch.randn(shape, dtype=dtype, requires_grad=True)]
        inputs += [torch.randn(shape[-1], dtype=dtype, requires_grad=True) for _ in range(n_params)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = ember.explain(lambda *a, fn=fn: torch.autograd.grad(fn(*a).sum(), a), *inputs, target="cuda",
                                   options={"row_chunks": 4})
        chunked = [k for k in report.kernels if "ember_chunk" in k.source]
        assert chunked and all("// strategy: rows" in k.source for k in chunked)
        # block c takes rows c, c + chunks, ... (the grid is a block per run)
        assert all("for (I ember_row = blockIdx.x; ember_row < ember_rows; ember_row += gridDim.x) {" in k.source
                   and "const int64_t ember_chunk = (int64_t)blockIdx.x;" in k.source for k in chunked)
        kernels += sources(report, f"chunk{i}")
    compile_batches(kernels, tmp_path, per_file=len(kernels))


@pytest.mark.parametrize("dynamic, tokens", [(True, 8), (False, 4096)], ids=["dynamic", "static_4096"])
def test_a_load_balancing_loss_keeps_its_checks_and_chunk_sums_apart(dynamic, tokens):
    # a Switch-style auxiliary loss: one_hot's checks reduce over all of the softmax kernel's
    # rows, and the chunk sums of the router's gradient joined that kernel, which could not finish
    # them ("fusion planning is stuck"): the graph ran through ATen with a warning
    def aux(x, w):
        probs = (x @ w).softmax(-1)
        return (F.one_hot(probs.argmax(-1), 3).float().mean(0) * probs.mean(0)).sum()

    x, w = torch.randn(tokens, 4), torch.randn(4, 3)
    a, b = ([t.clone().requires_grad_() for t in (x, w)] for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        loss = ember.compile(aux, dynamic=dynamic)(*a)
        loss.backward()
    ref = aux(*b)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close((a[0].grad, a[1].grad), (b[0].grad, b[1].grad))
