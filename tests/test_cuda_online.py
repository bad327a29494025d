"""Online softmax in the CUDA C++ backend (codegen/cuda_online.py): rows too long to keep in
registers accumulate their max and their sum of exp(x - max) in one loop, so the row is read from
memory once for both. Rows that are kept keep the two loops. Running them needs a GPU
(EMBER_TEST_DEVICE=cuda); the sources are checked and compiled here."""

from __future__ import annotations

import re
import subprocess

import pytest
import torch
import torch.nn.functional as F

from ember.codegen import cuda

from .conftest import DEVICE
from .helpers import check
from .test_cuda import NVCC, explain, needs_nvcc, sources


def loops(source: str) -> list[str]:
    """The row loops' labels, once each (a loop's vector and scalar forms share one)."""
    return list(dict.fromkeys(re.findall(r"// (loop \d: [^-]*?) --", source)))


def test_long_rows_take_max_and_sum_in_one_loop():
    # cross-entropy over GPT-2's vocabulary: the max's loop also sums, the sum's loop is gone
    x, t = torch.randn(8, 50257, dtype=torch.bfloat16), torch.randint(0, 50257, (8,))
    (src,) = [k.source for k in explain(lambda x, t: F.cross_entropy(x, t), x, t).kernels]
    assert loops(src) == ["loop 1: amax and its online softmax sum"]
    # in groups: each group's max first, one rescale of the running sum a group
    assert src.count("float ember_xs2[8];") == 1
    assert "acc15 = acc15 * ember_exp_approx(acc2 - ember_mu0) + ember_gs0;" in src
    # the terms one ex2.approx.ftz each (no subnormal fix-up: lost next to the max's 1 anyway)
    assert "ember_gs0 += ember_exp_ftz(ember_xs2[ember_k] - ember_mu0);" in src
    # one element at a time in the scalar loop and the peeled row's head and tail
    use = "(ember_mn == -INFINITY ? 0.0f : ember_mn)"
    assert src.count(f"acc15 = acc15 * ember_exp_approx(acc2 - {use}) + ember_exp_ftz(v1 - {use});") == 2
    # across the block: the threads' sums rescaled to the block's max before they are added
    combine = src.index("const float ember_mt2 = acc2;")
    assert src.index("acc2 = ember_block_reduce(acc2, EmberMaxOp()", combine) < src.index(
        "acc15 *= ember_exp_approx(ember_mt2 - (v2 == -INFINITY ? 0.0f : v2));", combine) < src.index(
        "acc15 = ember_block_reduce(acc15, EmberSumOp()", combine)
    # softmax: the store loop still reads the row again; logsumexp's guard takes +inf to 0 too
    (src,) = [k.source for k in explain(lambda x: torch.softmax(x, -1), x).kernels]
    assert loops(src) == ["loop 1: amax and its online softmax sum", "loop 3: store"]
    (src,) = [k.source for k in explain(lambda x: torch.logsumexp(x.float(), -1), x).kernels]
    assert "(fabsf(ember_mn) == INFINITY ? 0.0f : ember_mn)" in src
    # a softmax and a logsumexp of one x: one max, two sums (the guard differs), each rescaled
    (src,) = [k.source for k in explain(lambda x: (torch.softmax(x, -1), torch.logsumexp(x, -1)),
                                        torch.randn(8, 20480)).kernels]
    assert src.count("float ember_xs") == 1 and src.count("ember_gs1 += ") == 1
    assert len(re.findall(r"acc\d+ \*= ember_exp_approx\(ember_mt\d+ - ", src)) == 2


def test_rows_kept_in_registers_keep_two_loops():
    # 4096 fits a block's one iteration: the sum's loop reads registers, fewer instructions
    (src,) = [k.source for k in explain(lambda x: torch.softmax(x, -1),
                                        torch.randn(8, 4096, dtype=torch.bfloat16)).kernels]
    assert loops(src) == ["loop 1: amax", "loop 2: sum", "loop 3: store"]
    assert "online softmax" not in src
    # a row length known only at run time may fit: two loops
    (src,) = [k.source for k in explain(lambda x: torch.softmax(x, -1),
                                        torch.randn(8, 40000, dtype=torch.bfloat16), dynamic=True).kernels]
    assert "online softmax" not in src


@needs_nvcc
def test_online_rows_compile(tmp_path):
    x, t = torch.randn(8, 50257, dtype=torch.bfloat16), torch.randint(0, 50257, (8,))
    kernels = (sources(explain(lambda x, t: F.cross_entropy(x, t), x, t), "ce")
               + sources(explain(lambda x: torch.logsumexp(x.float(), -1), torch.randn(8, 40000)), "lse"))
    path = tmp_path / "online.cu"
    path.write_text(cuda.PRELUDE + "\n" + "\n\n".join(kernels) + "\n")
    proc = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-o",
                           str(path.with_suffix(".cubin")), str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "warning" not in proc.stderr and " 0 bytes spill stores" in proc.stderr, proc.stderr[-4000:]


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_online_rows_match_eager_on_the_gpu(dtype):
    """Long rows, aligned (groups), peeled and misaligned (one element at a time), with -inf,
    +inf and NaN in some rows and a row of -inf only: softmax, log-softmax, logsumexp (guarded)
    and cross-entropy against eager."""
    def rows(x):
        return torch.softmax(x, -1), torch.log_softmax(x.float(), -1), torch.logsumexp(x, -1)

    def loss(x, t):
        return F.cross_entropy(x, t), F.cross_entropy(x.float(), t, reduction="none")

    options = {"gpu_backend": "cuda"}
    for width in (20480, 50257):
        base = torch.randn(9 * width + 1, dtype=dtype, device="cuda") * 4
        for shift in (0, 1):
            x = base[shift:shift + 9 * width].view(9, width).clone() if shift == 0 else \
                base[shift:shift + 9 * width].view(9, width)
            x[1, ::7] = float("-inf")
            x[2] = float("-inf")
            x[3, 5] = float("inf")
            x[4, width // 2] = float("nan")
            x[5, -1] = 80.0  # the max in the row's tail
            check(rows, x, options=options)
            t = torch.randint(0, width, (9,), device="cuda")
            finite = x[[0, 1, 5, 6, 7, 8]]  # (a loss over inf or NaN logits is NaN in both)
            check(loss, finite, t[:6], options=options)
