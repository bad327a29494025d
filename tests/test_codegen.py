"""Generated code: readable kernels and host programs, exact literals, debug output."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings

import sympy
import torch

import ember
from ember.codegen.cexpr import index_expr
from ember.codegen.cpp import CPP
from ember.codegen.cstyle import literal
from ember.ir import dtypes

from .helpers import check, run


def test_literals_are_exact():
    assert literal(0.1, dtypes.float32, CPP) == "0.10000000149011612f"  # the float32 eager uses
    assert literal(0.1, dtypes.float64, CPP) == "0.1"
    assert literal(math.inf, dtypes.float32, CPP) == "((float)INFINITY)"
    assert "NAN" in literal(math.nan, dtypes.float64, CPP)
    assert literal(-(2**63), dtypes.int64, CPP) == "INT64_MIN"
    assert literal(True, dtypes.bool_, CPP) == "true"


def test_index_expressions():
    s0, o0, r0 = sympy.symbols("s0 o0 r0", integer=True, nonnegative=True)
    assert index_expr(o0 * s0 + r0) == "o0*s0 + r0"
    assert index_expr(sympy.Integer(2**40)) == "INT64_C(1099511627776)"
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing
    assert index_expr(FloorDiv(o0, 3)) == "o0 / 3"
    assert index_expr(ModularIndexing(o0, 4, s0)) == "(o0 / 4) % s0"


def test_kernel_source_is_readable():
    _, report = run(lambda x, w: torch.relu(x) * w + 1, torch.randn(64, 32), torch.randn(32))
    src = report.kernels[0].source
    lines = src.splitlines()
    assert lines[0].startswith("// fused_relu_mul_add_0: fuses aten.relu, aten.mul, aten.add")
    assert any(line.startswith("  #pragma omp parallel for") for line in lines)
    assert any(line.startswith("    #pragma omp simd") for line in lines)
    assert 'extern "C" void fused_relu_mul_add_0(const float* __restrict__' in src
    wrapper = report.graphs[0].wrapper
    assert wrapper.startswith("def call(args):") and "fused_relu_mul_add_0(" in wrapper
    compile(wrapper, "<wrapper>", "exec")


def test_reduction_kernels_show_their_loops():
    _, report = run(lambda x: torch.softmax(x, -1), torch.randn(8, 40))
    src = report.kernels[0].source
    assert "// loop 1: amax" in src and "// loop 2: sum" in src and "// loop 3: store" in src
    # the max: the hardware's max and a NaN flag (one instruction in the accumulator's chain)
    assert "reduction(emaxnum:acc1) reduction(|:acc1_nan)" in src and "reduction(+:" in src
    assert "if (acc1_nan) acc1 = (float)NAN;" in src


def test_a_value_rounded_to_bf16_is_stored_from_its_float32_source():
    # softmax's bf16 result: the store converts the float32 quotient once (rounding it to bf16
    # and converting the rounded value again gives the same bits, at twice the cost)
    for target in ("cpp", "cuda"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = ember.explain(lambda x: torch.softmax(x, -1), torch.randn(8, 64, dtype=torch.bfloat16),
                                   target=target)
        body = report.kernels[0].source.split("_body(" if target == "cuda" else 'extern "C"', 1)[1]
        assert "ember_round_bf16" not in body and "ember_f32_to_bf16" in body, (target, body)
    # where the rounded value feeds more than the store (a sum of it), it is still rounded once
    def stored_and_summed(x):
        y = (x * 3).to(torch.bfloat16)
        return y, y.sum()

    fn = stored_and_summed
    check(fn, torch.randn(8, 64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = ember.explain(fn, torch.randn(8, 64), target="cuda")
    assert any("ember_round_bf16" in k.source.split("_body(", 1)[1] for k in report.kernels)


def test_debug_levels(tmp_path, capsys):
    # EMBER_DEBUG read from the environment, in a process of its own; torch's caches private to
    # it too: an AOTAutograd entry from an earlier run (the default is one directory per machine
    # user) would rebuild the graph, not compile it
    script = (
        "import torch, ember\n"
        "f = ember.compile(lambda x: torch.relu(x) + 1)\n"
        "f(torch.randn(8)); f(torch.randn(8))\n"
    )
    env = {"EMBER_DEBUG": "1", "EMBER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = {1: proc.stderr}
    # the higher levels here, as the option (a process takes seconds to start)
    for level in (2, 3, 4):
        torch._dynamo.reset()
        capsys.readouterr()
        f = ember.compile(lambda x: torch.relu(x) + 1, options={"debug": level, "cache_dir": tmp_path})
        f(torch.randn(8))
        f(torch.randn(8))
        outputs[level] = capsys.readouterr().err
    assert "inference_0: 1 kernel(s)" in outputs[1] and "after cse" not in outputs[1]
    planned = r"inference_0: planned 1 kernel\(s\) for \d+ nodes in \d+ ms \(1 attempt\(s\), 0 kernel build"
    assert re.search(planned, outputs[1])  # where a compile's time goes
    assert "after cse" in outputs[2] and 'extern "C"' not in outputs[2]
    assert 'extern "C"' in outputs[3] and "def call(args)" in outputs[3]
    assert "fused_relu_add_0" in outputs[4] and " ms" in outputs[4].split("fused_relu_add_0")[-1]


def test_stats_keys():
    keys = set(ember.stats())
    assert {"graphs_compiled", "kernels_built", "cache_hits", "fallbacks"} <= keys


def test_long_chains_compile():
    # an unrolled loop of hundreds of pointwise ops (through views too, and into a reduction)
    # fused into one kernel: building it recursed a few Python frames per op, past Python's
    # recursion limit, and the graph ran through ATen
    def pointwise(x):
        for i in range(400):
            x = torch.sin(x) + x if i % 3 == 0 else x * 0.999 + 0.001
        return x, x.sum(-1)

    def transposes(x):
        for _ in range(300):
            x = x.t() * 1.001 + 0.001
        return x

    for fn, x in ((pointwise, torch.randn(33, 7)), (transposes, torch.randn(6, 6))):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="ember", category=RuntimeWarning)  # (no fallback)
            check(fn, x)
