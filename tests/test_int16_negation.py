"""int16 arithmetic that wraps at -32768, against eager, and the PTX both GPU backends hand to
ptxas. ptxas (12.8, which Triton 3.6 bundles, and 13.0; sm_90) takes the result of ``neg.s16``
(and ``abs.s16``) as already sign-extended in its 32-bit registers: -(-32768) reached the
division or comparison after it as +32768, so int16 ``(-x) // -3`` at -32768 was -10923 on an
H100 in both backends (eager's 10922; GPU fuzz, seed 79063875724). LLVM makes neg.s16 of any
int16 negation it can see (0 - x, x * -1, x // -1 too), so kernels compute int16 arithmetic in
int32 and cut it back through PTX it cannot see into (c_prelude.py: ember_wrap_i16,
runtime/triton_bits.py: wrap_i16). Checked here on the CPU: nvcc and Triton compile ember's
kernels for sm_90 without a GPU."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import ember

from .conftest import DEVICE
from .helpers import compile_for_sm90, cuda_ptx, on_the_interpreter, run


def _negations(x):
    return ((-x) // -3, (-x) % -3, ((-x) < 0).short(), (0 - x) // 3, (x * -1) // 3, ((x // -1) < 0).short(),
            ((-x).int() // 3).short(), (x.int() * -1).short() // 3, torch.where(x < 0, -x, x) // 3, x.abs() % 5,
            (x + x) // 3, (x - 1) // 2)


def _x(device=DEVICE):
    return torch.tensor([-32768, -32767, -7, -1, 0, 5, 32766, 32767], dtype=torch.int16, device=device)


# (on a GPU both of its backends; on the CPU C++ and interpreted Triton)
_TARGETS = ["cuda", "triton"] if DEVICE == "cuda" else [None, pytest.param("triton", marks=on_the_interpreter)]


@pytest.mark.parametrize("target", _TARGETS, ids=["cuda" if DEVICE == "cuda" else "native", "triton"])
def test_int16_arithmetic_that_wraps_equals_eager(target):
    x = _x()
    out, report = run(_negations, x, options={"target": target} if target else None)
    assert report.kernels and not report.fallbacks, report.fallbacks
    for i, (o, r) in enumerate(zip(out, _negations(x))):
        assert o.dtype == r.dtype and torch.equal(o, r), (i, o, r)


def _explain(target: str) -> ember.Report:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(_negations, _x("cpu"), target=target)
    assert report.kernels and all(k.backend == target for k in report.kernels), report.kernels
    return report


def _no_narrow_negation(ptx: str) -> None:
    lines = [line.strip() for line in ptx.splitlines() if "neg.s16" in line or "abs.s16" in line]
    assert not lines, lines


def test_cuda_kernels_give_ptxas_no_int16_negation(tmp_path):
    ptx = cuda_ptx(tmp_path / "k.cu", _explain("cuda"))
    assert "bfe.s32" in ptx  # (the cut back to int16 is there)
    _no_narrow_negation(ptx)


def test_triton_kernels_give_ptxas_no_int16_negation(tmp_path):
    pytest.importorskip("triton")
    (kernel,) = _explain("triton").kernels
    params = kernel.source.split(f"def {kernel.name}(")[1].split(")")[0]
    types = {p: "*i16" for p in params.split(", ") if p.startswith(("arg", "buf"))}
    types |= {"WORKSPACE": "*fp64", "COUNTER": "*i32"}
    constexprs = {"BIG": False, "XBLOCK": 1024, "RBLOCK": 1, "PERSISTENT": False, "NPROG_BLOCK": 1}
    ptx, _ = compile_for_sm90(tmp_path, kernel.source, kernel.name, types, constexprs)
    assert "bfe.s32" in ptx
    _no_narrow_negation(ptx)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_cuda_kernels_divide_narrow_integers_in_32_bits(tmp_path):
    # (int16 and int32 divisions went through int64: a software routine on the GPU, and
    # int16 (-x) // -3 + y ran at 2.3 TB/s on an H100 where its other int16 kernels ran at 2.9)
    def divide(x, y):
        return x // y, x % y, torch.div(x, y, rounding_mode="trunc"), torch.fmod(x, y)

    sources = {}
    for dtype in (torch.int16, torch.int32, torch.int64):
        x = torch.tensor([-7, 7, 9], dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = ember.explain(divide, x, x.flip(0), target="cuda")
        sources[dtype] = cuda_ptx(tmp_path / f"{dtype}.cu", report)
    for dtype in (torch.int16, torch.int32):
        assert "div.s32" in sources[dtype] and "div.s64" not in sources[dtype], dtype
    assert "div.s64" in sources[torch.int64]
