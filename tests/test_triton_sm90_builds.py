"""ember's Triton kernels compiled for sm_90 on the CPU (Triton compiles without a GPU; the
suite's other Triton tests run interpreted), specialized as Triton's launcher specializes them
on the GPU: where Triton's compiler crashed on a kernel ember rendered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import ember

pytest.importorskip("triton")

_COMPILE = """
import importlib.util, json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
spec = importlib.util.spec_from_file_location("kernel_under_test", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
r = json.loads(sys.argv[2])
aligned = {(i,): [["tt.divisibility", 16]] for i in r["aligned"]}
triton.compile(ASTSource(getattr(mod, r["name"]), r["signature"], constexprs=r["constexprs"], attrs=aligned),
               target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
"""


def _compile_for_sm90(tmp_path: Path, source: str, name: str, types: dict[str, str], constexprs: dict) -> None:
    """Compile ``name`` of ``source`` for sm_90: its parameters typed by ``types`` (pointers
    16-byte aligned), else by ``constexprs``, else 32-bit ints."""
    module = tmp_path / "kernel_under_test.py"
    module.write_text("import triton\nimport triton.language as tl\nfrom ember.runtime import triton_helpers as eh\n\n"
                      + source + "\n")
    params = [p.split(":")[0].strip() for p in source.split(f"def {name}(")[1].split(")")[0].split(",")]
    signature = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in params}
    pointers = [i for i, t in enumerate(signature.values()) if t.startswith("*")]
    spec = json.dumps({"name": name, "signature": signature, "constexprs": constexprs, "aligned": pointers})
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # (compiled for sm_90, not run)
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(module), spec], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


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
    _compile_for_sm90(tmp_path, kernel.source, kernel.name, types, constexprs)
