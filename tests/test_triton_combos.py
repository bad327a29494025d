"""Combo kernels (codegen/triton_combos.py): small independent pointwise kernels of different
sizes launched as one Triton kernel, run by the interpreter on CPU tensors against
eager: an optimizer's foreach step over parameters of several shapes, the launch's grid, what
must stay apart, and the switch that turns them off."""

from __future__ import annotations

import re

import sympy
import torch

import ember
from ember.codegen.triton_combos import MAX_PARTS, combinable, combine_kernels
from ember.ir import dtypes as dt
from ember.runtime import triton_configs as tc
from ember.schedule.kernel_ir import Access, Kernel, Param, Value, outer_var
from ember.schedule.steps import KernelStep, Schedule

from .conftest import INTERPRETED_TRITON
from .test_triton import _recording_grids, rendered

pytestmark = INTERPRETED_TRITON

# a GPT-like mix: sizes of one block, odd sizes, two of one size (a part in lanes), a big one
SHAPES = [(64, 80), (80,), (1,), (7,), (3, 33), (4100,), (4100,), (5000, 3)]


def _adam(shapes, compiled_options=None, steps=3):
    torch.manual_seed(0)
    params = [torch.randn(s).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape)
    opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
    report = ember.Report()
    step = opt.step if compiled_options is None else ember.compile(opt.step, options=compiled_options, report=report)
    for _ in range(steps):
        step()
    state = [p.detach() for p in params] + [t for p in params for t in opt.state[p].values()]
    return state, report


def _parts(source: str) -> list[str]:
    return re.findall(r"^        (\w+)\(", source, re.M)


def test_a_foreach_step_over_parameters_of_several_sizes_is_one_launch(monkeypatch):
    # 8 parameters of 7 sizes: a kernel per size before, now the step counts' kernel (which
    # also steps the parameter of one element, the counts' size) and one combo of the other 6;
    # the parameters and their state are written in place, as eager's step does
    grids = _recording_grids(monkeypatch)
    want, _ = _adam(SHAPES)
    got, report = _adam(SHAPES, {"target": "triton"})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    (graph,) = report.graphs
    combos = [k for k in graph.kernels if k.name.startswith("combo_of_")]
    assert len(graph.kernels) == 2 and len(combos) == 1, [k.name for k in graph.kernels]
    (combo,) = combos
    parts = _parts(combo.source)
    assert len(parts) == 6, combo.source
    assert all(f"def {p}(" in combo.source for p in parts)
    assert "lane ==" in combo.source  # (the two parameters of 4100 floats: one part, in lanes)
    assert "stored in place" in graph.wrapper and ".copy_(" not in graph.wrapper, graph.wrapper
    # its grid: every part's blocks (times its lanes), at the largest part's block size
    (grid,) = {g for n, g in grids if n == combo.name}  # (a launch a step, interpreted)
    xblock = tc.heuristic("pointwise", 15000, 1, tc.KernelHints())[0]["XBLOCK"]
    sizes = sorted({sympy.prod(s) for s in SHAPES} - {1})
    lanes = {4100: 2}
    assert grid == (sum(-(-int(n) // xblock) * lanes.get(int(n), 1) for n in sizes),), (grid, xblock)


def test_combo_kernels_off_launch_a_kernel_per_size():
    want, _ = _adam(SHAPES)
    got, report = _adam(SHAPES, {"target": "triton", "combo_kernels": False})
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    names = [k.name for k in report.graphs[0].kernels]
    assert len(names) == 7 and not any(n.startswith("combo_of_") for n in names), names


def test_pointwise_kernels_of_several_sizes_at_awkward_sizes_and_dtypes():
    # 0 elements (no kernel), 1, odd sizes, 16-bit and integer outputs beside float ones
    def f(a, b, c, d, e):
        return a * 2, b.sin(), (c + 1).to(torch.bfloat16), d // 3, e.exp()

    args = (torch.randn(1), torch.randn(33, 3), torch.randn(4097), torch.randint(-9, 9, (5, 7)), torch.randn(0))
    report = ember.Report()
    got = ember.compile(f, options={"target": "triton"}, report=report)(*args)
    for g, w in zip(got, f(*args)):
        torch.testing.assert_close(g, w)
    # (the exp of no elements is a kernel of its own, which launches nothing)
    (combo,) = [k for k in report.kernels if k.name.startswith("combo_of_")]
    assert len(_parts(combo.source)) == 4 and len(report.kernels) == 2, combo.source


def test_a_kernel_reading_what_another_wrote_is_not_its_part():
    def kernel(name, reads, writes, n):
        o0 = outer_var(0)
        values = [Value("load", dt.float32, (), Access(b, o0)) for b in reads]
        values += [Value("store", dt.float32, (values[0],), Access(b, o0)) for b in writes]
        params = [Param(b, dt.float32, False) for b in reads] + [Param(b, dt.float32, True) for b in writes]
        return Kernel(name, params, [], (sympy.Integer(n),), (), values)

    def combined(*kernels):
        steps = [KernelStep(k, [], []) for k in kernels]
        return [s.kernel.name for s in combine_kernels(Schedule(_Graph(), steps, {}, list(kernels))).steps]

    a, b = kernel("a", ["x"], ["y"], 100), kernel("b", ["z"], ["w"], 30)
    assert combined(a, b) == ["combo_of_2_a"]
    assert combined(a, kernel("reads_y", ["y"], ["v"], 30)) == ["a", "reads_y"]  # reads what a wrote
    assert combined(a, kernel("writes_x", ["z"], ["x"], 30)) == ["a", "writes_x"]  # writes what a read
    assert combined(a, kernel("writes_y", ["z"], ["y"], 30)) == ["a", "writes_y"]  # writes what a wrote
    many = [kernel(f"k{i}", [f"x{i}"], [f"y{i}"], 10 + i) for i in range(MAX_PARTS + 3)]
    assert combined(*many) == [f"combo_of_{MAX_PARTS}_k0", "combo_of_3_k16"]
    # a symbolic size takes no part
    s = sympy.Symbol("s0", integer=True, positive=True)
    symbolic = Kernel("sym", a.params, [s], (s,), (), a.values)
    assert not combinable(symbolic)
    # a run passes over other kernels, unless its later member reads what they wrote (or writes
    # what they wrote or read)
    assert combined(kernel("c", ["x"], ["u"], 100), symbolic, b) == ["combo_of_2_c", "sym"]
    assert combined(kernel("c", ["x"], ["u"], 100), symbolic, kernel("d", ["y"], ["v"], 30)) == ["c", "sym", "d"]
    assert combined(kernel("c", ["q"], ["u"], 100), symbolic, kernel("d", ["z"], ["y"], 30)) == ["c", "sym", "d"]
    assert combined(kernel("c", ["q"], ["u"], 100), symbolic, kernel("d", ["z"], ["x"], 30)) == ["c", "sym", "d"]


class _Graph:
    nodes: list = []


def test_symbolic_sizes_keep_a_kernel_each():
    def f(a, b):
        return a * 2, b.cos()

    report = rendered(f, torch.randn(100), torch.randn(30), dynamic=True)
    assert len(report.kernels) == 2 and not any(k.name.startswith("combo_of_") for k in report.kernels)


def test_a_run_passes_over_a_row_kernel_only_where_nothing_depends_on_it():
    # a.sin() and c.cos() * 2 combine past x's row sums, planned between them; where c's kernel
    # also reads the row sums, it runs after them (with a.sin(), if that is planned after them)
    def independent(a, x, c):
        return a.sin(), x.sum(-1) * 3, c.cos() * 2

    def dependent(a, x, c):
        r = x.sum(-1) * 3
        return a.sin(), r, c.cos() + r[:7]

    args = (torch.randn(100), torch.randn(30, 50), torch.randn(7))
    for f in (independent, dependent):
        report = ember.Report()
        got = ember.compile(f, options={"target": "triton"}, report=report)(*args)
        for g, w in zip(got, f(*args)):
            torch.testing.assert_close(g, w)
        names = [k.name for k in report.kernels]
        if f is independent:
            assert names == ["combo_of_2_fused_sin_1", "fused_sum_mul_0"], names
        else:
            cos = next(i for i, k in enumerate(report.kernels) if "aten.cos" in k.aten_ops)
            assert cos > names.index("fused_sum_mul_0"), names
        alone = ember.explain(f, *args, target="triton", options={"combo_kernels": False})
        assert len(alone.kernels) == 3 and not any(k.name.startswith("combo") for k in alone.kernels)
