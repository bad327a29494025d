"""ember's Triton kernels compiled for sm_90 on the CPU (Triton compiles without a GPU; the
suite's other Triton tests run interpreted), specialized as Triton's launcher specializes them
on the GPU: where Triton's compiler crashed on a kernel ember rendered."""

from __future__ import annotations

import warnings

import pytest
import torch

import ember

from .helpers import compile_for_sm90

pytest.importorskip("triton")


def test_a_lane_of_one_block_with_a_specialized_size_builds(tmp_path):
    # Dynamic sizes arrive as quotients by their power-of-two divisors; Triton's launcher makes a
    # quotient of 1 a constant (8 elements: OUTER = 1 * ALIGN_OUTER). A pointwise kernel in lanes
    # then had one block, its block index and whole-block test folded to constants, and Triton
    # 3.6's coalescing pass crashed ("PassManager::run failed"; the kernel fell back to ATen
    # with a warning; GPU fuzz, seed 676563135342)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(lambda a, b: (a * 2, b + 1), torch.randn(8), torch.randn(8, 3)[:, 0],
                               target="triton", dynamic=True)
    (kernel,) = report.kernels
    assert "lane == 1" in kernel.source, kernel.source
    types = {p: "*fp32" for p in ("arg1_1", "arg3_1", "buf0", "buf1")} | {"WORKSPACE": "*fp64", "COUNTER": "*i32"}
    constexprs = {"OUTER": 1, "INNER": 1, "BIG": False, "XBLOCK": 64, "RBLOCK": 1, "PERSISTENT": False,
                  "NPROG_BLOCK": 1, "ALIGN_OUTER": 8, "ALIGN_INNER": 1}
    params = kernel.source.split(f"def {kernel.name}(")[1].split(")")[0]
    constexprs |= {p.split(":")[0]: 1 for p in params.split(", ") if p.startswith("ALIGN_s")}  # (strides of 3)
    assert "ALIGN_s" in str(constexprs), params
    compile_for_sm90(tmp_path, kernel.source, kernel.name, types, constexprs, num_warps=1)
