"""Conditional execution: a where's untaken branch is not computed (schedule/guards.py, always on
and exact), and the ``skip_masked`` option turns masked multiplies into selects
(passes/masks.py), so padded code skips its padding."""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings

import pytest
import torch

import ember
from ember.codegen import cuda
from ember.ir import GraphBuilder, Op, dtypes, structurally_equal, verify
from ember.passes import cse, dce
from ember.passes.masks import mask_multiplies
from ember.workloads.giou import make_batch, padded_giou_loss

from .conftest import INTERPRETED_TRITON
from .helpers import check

SKIP = {"skip_masked": True}


def explain(fn, *args, target=None, options=None) -> ember.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(fn, *args, target=target, options=options)
    assert not [g.error for g in report.graphs if g.error], [g.error for g in report.graphs]
    return report


def rewritten(graph):
    verify(graph)
    out = dce(cse(mask_multiplies(graph)))
    verify(out)
    return out


def assert_graph(after, expected):
    expected = dce(cse(expected))  # shared nodes are shared in both
    assert structurally_equal(after, expected), f"got:\n{after}\n\nexpected:\n{expected}"


# ---- the skip_masked rewrite, graph in -> graph out --------------------------------------------

def _mask(b, y):
    return b.cast(b.gt(y, b.full(0.0, y.shape)), dtypes.float32)


def test_masked_multiply_becomes_a_select():
    b = GraphBuilder()
    x, y = b.input((4, 3)), b.input((4, 3))
    before = b.build(b.mul(x, _mask(b, y)))
    e = GraphBuilder()
    x, y = e.input((4, 3)), e.input((4, 3))
    expected = e.build(e.where(e.gt(y, e.full(0.0, y.shape)), x, e.full(0.0, (4, 3))))
    assert_graph(rewritten(before), expected)


def test_the_select_moves_out_through_what_keeps_a_zero_a_zero():
    # -(x * m) / z + (w * m), viewed: one select around everything, the sum outside it
    b = GraphBuilder()
    x, y, z, w = (b.input((4, 3)) for _ in range(4))
    m = _mask(b, y)
    t = b.add(b.div(b.neg(b.mul(x, m)), z), b.mul(m, w))
    before = b.build(b.sum(b.permute(t, (1, 0)), (0,)))
    e = GraphBuilder()
    x, y, z, w = (e.input((4, 3)) for _ in range(4))
    c = e.permute(e.gt(y, e.full(0.0, (4, 3))), (1, 0))
    inner = e.permute(e.add(e.div(e.neg(x), z), w), (1, 0))
    expected = e.build(e.sum(e.where(c, inner, e.full(0.0, (3, 4))), (0,)))
    assert_graph(rewritten(before), expected)


def test_a_mask_alone_is_a_select_of_ones():
    # a loss's gradient at tangent 1 starts from the mask itself: -m * x -> where(c, -1 * x, 0)
    b = GraphBuilder()
    x, y = b.input((5,)), b.input((5,))
    before = b.build(b.mul(b.neg(_mask(b, y)), x))
    e = GraphBuilder()
    x, y = e.input((5,)), e.input((5,))
    expected = e.build(e.where(e.gt(y, e.full(0.0, (5,))), e.mul(e.neg(e.full(1.0, (5,))), x),
                               e.full(0.0, (5,))))
    assert_graph(rewritten(before), expected)


def test_other_products_and_differently_masked_sums_are_left_alone():
    b = GraphBuilder()
    x, y, z = b.input((4,)), b.input((4,)), b.input((4,))
    plain = b.mul(x, z)                                         # no mask
    counted = b.sum(_mask(b, y), (0,))                          # the mask's count stays a count
    mixed = b.add(b.mul(x, _mask(b, y)), b.mul(x, _mask(b, z)))  # two different masks
    before = b.build(plain, counted, mixed)
    after = rewritten(before)
    assert after.outputs[0].op is Op.MUL and after.outputs[1].op is Op.SUM
    mixed_after = after.outputs[2]
    assert mixed_after.op is Op.ADD and all(i.op is Op.WHERE for i in mixed_after.inputs)


# ---- guards: the untaken branch of a where ------------------------------------------------------

def _branchy(x, y, m):
    return torch.where(m > 0, torch.exp(x) * y, 0).sum(-1)


def test_the_taken_branch_is_computed_inside_an_if():
    x, y, m = torch.randn(6, 10), torch.randn(6, 10), torch.randn(6, 10)
    (k,) = explain(_branchy, x, y, m).kernels
    # the IR names the guard; the C source computes exp(x) * y only where m > 0
    guarded = [line for line in k.kernel_ir.splitlines() if ", if v" in line]
    assert len(guarded) == 4, k.kernel_ir  # two loads, exp, mul
    block = re.search(r"if \((v\d+)\) \{\n(.*?)\n\s*\}", k.source, re.S)
    assert block is not None, k.source
    assert block.group(2).count("_1[") == 2 and "ember_exp" in block.group(2)
    assert f"{block.group(1)} = " in k.source.split("if (")[0]  # the condition comes first
    check(_branchy, x, y, m)


def _relu_backward_and_bias_grad(g, mask):
    dx = torch.where(mask, 0.0, g)
    return dx, dx.sum(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(48, 40), (512, 64), (0, 5), (1, 7)])
def test_a_guarded_load_alone_is_a_select_in_cpp(shape, dtype):
    # a guard's run of nothing but a load is ``v = g ? load : 0`` in C++, not an if block: GCC
    # 12 (jump threading and PRE off) left this column sum's simd loop scalar around the block, a
    # branch per element, 10x slower at 512 x 1024 (bench/cxx_flags_ab.py)
    g = torch.randn(shape, dtype=dtype)
    mask = torch.rand(shape) < 0.5
    if g.numel():
        g[mask] = float("nan")  # never selected: the select reads them or not, the same result
    report = check(_relu_backward_and_bias_grad, g, mask)
    if g.numel():
        (k,) = report.kernels
        assert "if (v" not in k.source, k.source
        assert re.search(r"= v\d+ \? [(\w]*arg1_1\[", k.source), k.source
    check(_relu_backward_and_bias_grad, g.t().contiguous().t(), mask, dynamic=True)  # (column-major)
    check(_relu_backward_and_bias_grad, g[:, ::2], mask[:, ::2], dynamic=True)


def _column_sum_of_a_select(x, y, m):
    return torch.where(m > 0, torch.exp(x) * y, 0).sum(0)


@pytest.mark.parametrize("dynamic", [False, True])
def test_column_tiles_compute_a_guarded_run_as_selects(dynamic):
    # in column tiles every guarded value is a select (GCC 12 left their simd loops scalar
    # around if blocks, 3-7x slower at static sizes); a row sum keeps its block (as selects it
    # ran 10-20% slower): test_the_taken_branch_is_computed_inside_an_if
    x, y, m = torch.randn(64, 40), torch.randn(64, 40), torch.randn(64, 40)
    x[m <= 0] = float("inf")  # exp(inf) * 0 would be NaN: only the untaken branch holds them
    y[m <= 0] = 0.0
    report = check(_column_sum_of_a_select, x, y, m, dynamic=dynamic)
    (k,) = report.kernels
    assert "// columns:" in k.source and "if (v" not in k.source, k.source
    assert re.search(r"= v\d+ \? ember_exp\(v\d+\) : \(float\)0;", k.source), k.source


def test_values_the_same_at_every_element_stay_unguarded(tmp_path):
    # a masked weight's gradient from a scalar loss: g / n is loaded and divided outside the
    # branch (inside it, a load of a scalar left GCC's loop scalar: "no vectype")
    def f(w, g, n):
        return torch.where(w != 0, w * (g / n), 0.0)
    w, g, n = torch.randn(40), torch.tensor(3.0), torch.tensor(7.0)
    w[::3] = 0
    (k,) = explain(f, w, g, n).kernels
    guarded = [line for line in k.kernel_ir.splitlines() if ", if v" in line]
    assert len(guarded) == 1 and "mul" in guarded[0], k.kernel_ir  # w * (g / n) alone
    assert "arg1_1[0]" in k.source.split("if (")[0], k.source
    check(f, w, g, n)


def test_values_needed_elsewhere_and_index_checks_stay_unguarded():
    def f(x, y, m, i):
        a = torch.where(m > 0, x.exp(), y)       # x is used below too: loaded always
        b = torch.where(m > 0, y[i], 0.0)        # eager raises for a bad index in either branch
        return a + x, b
    x, y, m = torch.randn(8), torch.randn(8), torch.randn(8)
    i = torch.tensor([0, 7, 3, 3, 1, 2, 5, 6])
    (k,) = explain(f, x, y, m, i).kernels
    ir = k.kernel_ir.splitlines()
    assert not any("arg0_1[" in line and ", if" in line for line in ir), k.kernel_ir  # x
    assert not any("checkindex" in line and ", if" in line for line in ir), k.kernel_ir
    check(f, x, y, m, i)
    bad = torch.tensor([0, 7, 3, 3, 1, 2, 5, 60])
    m_off = torch.full((8,), -1.0)  # the bad index sits in the untaken branch everywhere
    with pytest.raises(IndexError):
        f(x, y, m_off, bad)
    with pytest.raises(IndexError):
        ember.compile(f)(x, y, m_off, bad)


def test_else_branches_and_values_shared_by_two_wheres():
    def f(x, y, m):
        shared = torch.log(x.abs()) * 3
        a = torch.where(m > 0, 0.0, shared + 1)       # computed where m <= 0
        b = torch.where(m < -1, shared.sqrt(), y)     # and where m < -1: guard m <= 0 | m < -1
        return a, b
    x, y, m = torch.randn(5, 7), torch.randn(5, 7), torch.randn(5, 7)
    (k,) = explain(f, x, y, m).kernels
    assert "logical_not" in k.kernel_ir and "logical_or" in k.kernel_ir, k.kernel_ir
    assert "ember_log(" in re.search(r"if \(v\d+\) \{(.*?)\}", k.source, re.S).group(1)
    check(f, x, y, m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("target", ["cpp", pytest.param("triton", marks=INTERPRETED_TRITON)])
def test_nan_and_inf_in_the_untaken_branch_change_nothing(dtype, target):
    def f(x, m):
        return torch.where(m > 0, torch.log(x), torch.sqrt(x)), torch.where(m[:, :1] > 0, x.reciprocal(), 0).sum(-1)
    x = torch.randn(9, 33).to(dtype)
    x[0, :5] = 0.0
    x[1, 3] = float("nan")
    m = torch.randn(9, 33).to(dtype)
    check(f, x, m, options={"target": target})


@INTERPRETED_TRITON
def test_triton_masks_loads_with_a_rows_guard_and_strided_loads():
    def f(x, m, boxes, keep):
        rows = torch.where(m[:, None] > 0, x.exp(), 0).sum(-1)               # guard constant along rows
        per_box = torch.where(keep > 0, boxes[:, 0] * boxes[:, 2], 0.0)       # stride-4 loads
        contiguous = torch.where(keep > 0, boxes[:, 0].contiguous().exp(), 0.0)
        return rows, per_box, contiguous
    args = (torch.randn(6, 40), torch.randn(6), torch.randn(30, 4), torch.randn(30))
    report = explain(f, *args, target="triton")
    text = "\n".join(k.source for k in report.kernels)
    masked_loads = re.findall(r"tl\.load\([^\n]*& (v\d+), other=0\)", text)
    assert len(masked_loads) >= 3, text  # the row's x, and the two box coordinates
    check(f, *args, options={"target": "triton"})


# ---- skip_masked on the padded GIoU loss ---------------------------------------------------------

@pytest.mark.parametrize("target", ["cpp", pytest.param("triton", marks=INTERPRETED_TRITON)])
def test_padded_giou_skips_padding_forward_and_backward(target):
    pred, _, padded = make_batch(16)
    options = {**SKIP, "target": target}
    report = check(padded_giou_loss, pred, padded, options=options)
    (k,) = report.kernels
    if target == "cpp":  # every coordinate but the mask's is read inside the mask's block
        before, block = re.search(r"(.*?)if \(v\d+\) \{(.*?)\n\s*\}", k.source, re.S).groups()
        loads = r"\w+_1\[4\*r0(?: \+ \d)?\]"
        assert len(re.findall(loads, before)) == 1 and len(set(re.findall(loads, block))) == 7, k.source
    p1, p2 = pred.clone().requires_grad_(), pred.clone().requires_grad_()
    ember.compile(padded_giou_loss, options=options)(p1, padded).backward()
    padded_giou_loss(p2, padded).backward()
    torch.testing.assert_close(p1.grad, p2.grad)


def test_one_block_per_guard_in_the_gradient_kernel():
    # the forward kernel of training writes the loss and its gradient: under skip_masked the
    # whole GIoU chain and its derivative sit in one block behind the mask
    pred, _, padded = make_batch(8)
    pred.requires_grad_()
    (k,) = explain(padded_giou_loss, pred, padded, options=SKIP).graphs[0].kernels
    assert k.source.count("if (") == 1, k.source
    assert len(re.findall(r"\w+_\d+\[4\*r0(?: \+ \d)?\]", k.source.split("if (")[1])) == 7, k.source


def test_skip_masked_trades_nan_propagation_for_skipping_as_documented():
    pred, _, padded = make_batch(8)
    pred[0, -1] = float("nan")  # a padded box (box counts are small): masked out
    assert padded[0, -1, 3] == 0
    assert torch.isnan(padded_giou_loss(pred, padded))
    assert torch.isnan(ember.compile(padded_giou_loss)(pred, padded))           # exact by default
    skipped = ember.compile(padded_giou_loss, options=SKIP)(pred, padded)
    clean = pred.clone()
    clean[0, -1] = 0.5
    torch.testing.assert_close(skipped, padded_giou_loss(clean, padded))       # the NaN is never read


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_guarded_cuda_kernels_compile_for_sm90(tmp_path):
    pred, _, padded = make_batch(8)
    pred.requires_grad_()
    kernels = []
    for i, (fn, args, options) in enumerate([(padded_giou_loss, (pred, padded), SKIP),
                                             (_branchy, (torch.randn(6, 10),) * 3, None)]):
        for k in explain(fn, *args, target="cuda", options=options).kernels:
            assert "if (v" in k.source, k.source
            kernels.append(re.sub(rf"\b{k.name}\b", f"{k.name}_{i}", k.source))
    path = tmp_path / "guarded.cu"
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(kernels) + "\n")
    proc = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-o", str(tmp_path / "g.cubin"),
                           str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_minus_zero_fill_is_no_mask():
    # where(m, x, -0.0) fills with -0.0: moved out as a select it came back +0.0
    def fn(x, m, z):
        return torch.where(m > 0, x, -0.0) * z

    x, m, z = torch.randn(4, 8), torch.randn(4, 8), torch.rand(4, 8) + 0.5
    expected = fn(x, m, z)
    got = ember.compile(fn, options=SKIP)(x, m, z)
    assert torch.equal(got, expected)
    assert torch.equal(torch.signbit(got), torch.signbit(expected))
