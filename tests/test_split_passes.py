"""Passes over few long rows split into kernels of their own on GPUs (schedule/domains.py:
few_long_rows): a training-mode BatchNorm's mean, variance and normalization were one row kernel
of three loops with a program per channel (64 programs for a ResNet's stem on 132 SMs)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.schedule import domains

from .conftest import INTERPRETED_TRITON
from .helpers import assert_same, check, run


def bn_relu_with_grads(x, w, b, rm, rv, g):
    y = torch.relu(F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5))
    return (y, rm, rv, *torch.autograd.grad(y, (x, w, b), g))


def _bn_args(shape, dtype=torch.float32, channels_last=False):
    gen = torch.Generator().manual_seed(0)
    c = shape[1]
    x = torch.randn(shape, generator=gen).to(dtype) * 2 + 0.5
    g = torch.randn(shape, generator=gen).to(dtype)
    if channels_last:
        x, g = x.contiguous(memory_format=torch.channels_last), g.contiguous(memory_format=torch.channels_last)
    w, b = torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen)
    return (x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), torch.zeros(c), torch.ones(c), g)


def _loops(report: ember.Report) -> list[tuple[str, int]]:
    """(kind, inner loops) of each rendered Triton kernel, from its header comment (each part of
    a combo kernel: codegen/triton_combos.py)."""
    out = []
    for k in report.kernels:
        found = re.findall(r"# outer \[.*?\], inner \[.*?\], (\d+) inner loop\(s\), (\w+)", k.source)
        assert found, k.source[:300]
        out += [(kind, int(n)) for n, kind in found]
    return out


def _cuda_kernels(report: ember.Report) -> int:
    """The CUDA C++ kernels before combining: each part of a combo kernel counts (its header
    follows the parts' bodies: codegen/cuda_combos.py)."""
    parts = [re.search(r"^// \S+: (\d+) independent pointwise kernels", k.source, re.M) for k in report.kernels]
    return sum(int(m.group(1)) if m else 1 for m in parts)


def _bn_report(target: str, shape, dynamic: bool | None = None, **kw) -> ember.Report:
    # rendered, not run: on this machine the graph runs through ATen (ember.explain's target)
    return ember.explain(bn_relu_with_grads, *_bn_args(shape, **kw), target=target, dynamic=dynamic)


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_batch_norms_passes_over_few_long_rows_are_kernels_of_their_own(channels_last, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # rendered only: 1M elements take long interpreted
    shape = (8, 16, 128, 64)  # 16 channels of 65536: 1M elements
    loops = _loops(_bn_report("triton", shape, channels_last=channels_last))
    rows = [n for kind, n in loops if kind == "rows"]
    # the mean's sums, the variance's, the backward's two sums: one loop each, no second pass
    assert rows and max(rows) == 1 and len(rows) >= 3, loops
    assert sum(kind == "pointwise" for kind, _ in loops) >= 2, loops  # y and the input's gradient
    # the CUDA C++ backend gets the same plan; the CPU's keeps its row kernels of several loops
    assert _cuda_kernels(_bn_report("cuda", shape, channels_last=channels_last)) == len(loops)
    cpp = _bn_report("cpp", shape, channels_last=channels_last)
    assert len(cpp.kernels) < len(loops)


def test_short_or_many_rows_keep_their_passes_in_one_kernel(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    # 16 x 4096 elements in all: the kernels would cost more to launch than they save
    assert max(n for _, n in _loops(_bn_report("triton", (4, 16, 32, 32)))) >= 2
    # 4096 rows (a LayerNorm's tokens): a program each fills the GPU
    report = ember.explain(lambda x: F.layer_norm(x, (256,)), torch.randn(4096, 256), target="triton")
    assert _loops(report) == [("rows", 3)], _loops(report)
    # 512 rows of 8192 (a LayerNorm at a wide hidden size): each row stays in a program's registers
    report = ember.explain(lambda x: F.layer_norm(x, (8192,)), torch.randn(512, 8192), target="triton")
    assert _loops(report) == [("rows", 3)], _loops(report)


def test_symbolic_rows_are_judged_by_the_compiles_example(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    loops = _loops(_bn_report("triton", (8, 16, 128, 64), dynamic=True))
    assert max(n for kind, n in loops if kind == "rows") == 1, loops
    loops = _loops(_bn_report("triton", (2, 16, 8, 8), dynamic=True))
    assert max(n for kind, n in loops if kind == "rows") >= 2, loops


def test_few_long_rows_judges_by_rows_length_and_total():
    import sympy
    s = sympy.Symbol("s0", positive=True, integer=True)
    assert domains.few_long_rows((64,), (64, 12544), {})
    assert not domains.few_long_rows((64,), (16, 64), {})           # too short in all
    assert not domains.few_long_rows((4096,), (4096,), {})           # rows enough
    assert not domains.few_long_rows((8,), (1024,), {})              # rows too short
    assert domains.few_long_rows((), (1 << 21,), {})                 # one row: a full reduction
    assert domains.few_long_rows((64,), (s, 12544), {s: 64})
    assert not domains.few_long_rows((64,), (s, 12544), {s: 1})
    # contiguous rows (a LayerNorm's, a softmax's): only where too long for registers and too few
    assert not domains.few_long_rows((512,), (8192,), {}, contiguous=True)
    assert not domains.few_long_rows((64,), (8192,), {}, contiguous=True)
    assert domains.few_long_rows((16,), (128256,), {}, contiguous=True)  # a softmax over a vocabulary
    assert not domains.few_long_rows((512,), (65536,), {}, contiguous=True)


@INTERPRETED_TRITON
@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.float32, True),
                                                 (torch.bfloat16, True)])
def test_split_passes_compute_what_eager_does(dtype, channels_last, monkeypatch):
    """Run under Triton's interpreter with the thresholds lowered to these small shapes."""
    monkeypatch.setattr(domains, "PASS_SPLIT_ROW", 16)
    monkeypatch.setattr(domains, "PASS_SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(domains, "REGISTER_ROW", 8)
    args = _bn_args((3, 4, 5, 7), dtype, channels_last)
    report = check(bn_relu_with_grads, *args, options={"target": "triton"},
                   **({"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}))
    loops = _loops(report)
    assert max(n for kind, n in loops if kind == "rows") == 1, loops
    # softmax over 2 long rows, and a tensor over its full sum: the statistics, then the values
    check(lambda x: torch.softmax(x, -1), torch.randn(2, 50), options={"target": "triton"})
    report = check(lambda x: x / x.sum(), torch.randn(6, 9), options={"target": "triton"})
    assert sorted(kind for kind, _ in _loops(report)) == ["full", "pointwise"], _loops(report)


@INTERPRETED_TRITON
@pytest.mark.parametrize("channels_last", [False, True])
def test_running_statistics_are_epilogues_of_the_split_statistics_kernels(channels_last, monkeypatch):
    """The new running mean and variance are computed by the kernels whose programs finish the
    mean and the variance (by the last program of each row), stored into the buffers they
    update: no kernel of their own, no copies."""
    monkeypatch.setattr(domains, "PASS_SPLIT_ROW", 16)
    monkeypatch.setattr(domains, "PASS_SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(domains, "REGISTER_ROW", 8)
    x = torch.randn(3, 4, 5, 7) * 2 + 0.5
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def f(x, mean, var):
        return F.batch_norm(x, mean, var, training=True, momentum=0.1)

    eager = [x.clone(), torch.rand(4), torch.rand(4) + 1]
    given = [t.clone() for t in eager]
    out, report = run(f, *given, options={"target": "triton"})
    assert_same(out, f(*eager))
    assert_same(given, eager)
    wrapper = "\n".join(g.wrapper for g in report.graphs)
    assert wrapper.count("stored in place") == 2 and "write into its input" not in wrapper, wrapper
    loops = _loops(report)
    # the mean's pass, the variance's, the normalized values
    assert sorted(kind for kind, _ in loops) == ["pointwise", "rows", "rows"], loops
