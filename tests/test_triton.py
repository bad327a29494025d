"""The Triton backend, run on CPU tensors by Triton's interpreter (TRITON_INTERPRET=1, set in
conftest.py): the fusion patterns on each code path, PyTorch's OpInfo samples, fallbacks."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

import ember
from ember.workloads.giou import make_batch, padded_giou_loss

from .helpers import check
from .test_ops import check_op

TRITON = {"target": "triton"}
LOOPED = {"target": "triton", "triton_launch": {"PERSISTENT": False, "RBLOCK": 16}}


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = {
    "relu_add": (lambda x, y: torch.relu(x) + y + 1, lambda: (torch.randn(100, 33), torch.randn(33))),
    "rmsnorm_bf16": (rmsnorm, lambda: (torch.randn(20, 50).bfloat16(), torch.randn(50).bfloat16())),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(9, 70),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (40,), w, b),
                   lambda: (torch.randn(6, 40), torch.randn(40), torch.randn(40))),
    "giou": (padded_giou_loss, lambda: make_batch(16)[::2]),
    "argmax_max": (lambda x: (x.argmax(-1), x.max(0), x.argmin()), lambda: (torch.randn(7, 13),)),
    "var_sum_any": (lambda x: (x.var(), x.sum(), (x > 1).any(), x.prod(-1)), lambda: (torch.randn(7, 13),)),
    "int_ops": (lambda a, b: (a // b, a % b, (a * 3).sum(-1)),
                lambda: (torch.randint(-50, 50, (8, 9)), torch.randint(1, 7, (8, 9)))),
}


@pytest.mark.parametrize("options", [TRITON, LOOPED], ids=["tuned", "looped"])
@pytest.mark.parametrize("name", list(CASES))
def test_fusion_patterns(name, options):
    fn, make = CASES[name]
    report = check(fn, *make(), options=options)
    assert report.kernels and all(k.backend == "triton" for k in report.kernels)
    assert all("@triton.jit" in k.source for k in report.kernels)
    if name in ("relu_add", "rmsnorm_bf16", "softmax", "layer_norm", "giou"):
        assert len(report.kernels) == 1


def test_full_reduction_combines_partials_from_many_programs():
    pred, _, padded = make_batch(64)
    report = check(padded_giou_loss, pred, padded, options={"target": "triton", "triton_launch": {"RBLOCK": 64}})
    src = report.kernels[0].source
    assert "atomic_add(COUNTER" in src and "if done == nprog - 1:" in src


def test_symbolic_sizes():
    report = ember.Report()
    fast = ember.compile(rmsnorm, dynamic=True, options=TRITON, report=report)
    for rows, cols in [(3, 8), (5, 40), (2, 129)]:
        x, w = torch.randn(rows, cols), torch.randn(cols)
        torch.testing.assert_close(fast(x, w), rmsnorm(x, w))
    assert len(report.graphs) == 1


OPS = ["abs", "exp", "log1p", "tanh", "sigmoid", "erf", "round", "trunc", "sign", "nn.functional.gelu",
       "add", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "where", "clamp", "bitwise_xor",
       "sum", "amax", "argmin", "var", "softmax", "log_softmax", "nn.functional.layer_norm", "any"]


@pytest.mark.parametrize("op", [o for o in op_db if o.name in OPS and not o.variant_test_name],
                         ids=lambda o: o.name)
def test_opinfo_samples_through_triton(op):
    dtypes = [d for d in (torch.float32, torch.bfloat16, torch.int64) if d in op.supported_dtypes("cpu")]
    check_op(op, dtypes, options=TRITON)


def test_explain_renders_gpu_kernels_on_a_cpu_machine():
    report = ember.explain(rmsnorm, torch.randn(8, 32), torch.randn(32), target="triton")
    (k,) = report.kernels
    assert k.backend == "triton" and "def fused_" in k.source and "tl.reduce(" in k.source


def test_launch_failure_falls_back_once(monkeypatch):
    from ember.runtime import triton_backend

    def broken(self, *args, **kwargs):
        raise RuntimeError("simulated Triton compile error")

    monkeypatch.setattr(triton_backend.Launcher, "candidates", broken)
    x = torch.randn(5, 6)
    fast = ember.compile(lambda a: a.exp() * 2, options=TRITON)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(fast(x), x.exp() * 2)
        torch.testing.assert_close(fast(x), x.exp() * 2)
    assert len([w for w in caught if "failed to compile or launch" in str(w.message)]) == 1
