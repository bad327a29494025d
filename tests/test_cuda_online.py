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

import ember
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


def loop_text(source: str, loop: int) -> str:
    """Loop ``loop``'s lines (its vector and scalar forms), up to the next loop or the end."""
    parts = re.split(r"(?=// loop \d+: )", source)
    return "".join(p for p in parts if p.startswith(f"// loop {loop}: "))


def written_softmax(x):  # the GPU suite's softmax (bench/gpu_fusion.py), exp rounded to x's dtype
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kept_rows_sum_terms_flush_below_2_126(dtype):
    """A kept row's sum of exp(x - max(x)) takes its terms with one ex2.approx.ftz each: a term
    below 2^-126 (rounded to bf16 or not) is lost next to the max's own 1. The store loop's exp,
    which is stored, keeps its subnormals (the fix-up of ex2.approx.f32)."""
    x = torch.randn(8, 4096, dtype=dtype)
    for fn in (written_softmax, lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, -1)):
        (src,) = [k.source for k in explain(fn, x).kernels]
        assert loops(src) == ["loop 1: amax", "loop 2: sum", "loop 3: store"]
        assert re.search(r"ember_exp_ftz\(v\d+\)", loop_text(src, 2)) and "ember_exp_approx" not in loop_text(src, 2)
        assert "ember_exp_ftz" not in loop_text(src, 3)
    # not where the terms are also stored, masked, or against another row's max
    mask = torch.rand(8, 4096) > 0.5

    def stored(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e, e.sum(-1)

    def masked(x, mask):
        return (torch.exp(x - x.amax(-1, keepdim=True)) * mask).sum(-1)

    def other_max(x, y):
        return torch.exp(x - y.amax(-1, keepdim=True)).sum(-1)

    for fn, args in ((stored, (x,)), (masked, (x, mask)), (other_max, (x, x.flip(0)))):
        assert all("ember_exp_ftz" not in k.source for k in explain(fn, *args).kernels), fn.__name__


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


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
def test_kept_rows_keep_subnormal_probabilities_on_the_gpu():
    """The sum's terms flush below 2^-126, the softmax's own outputs do not: a logit 100 below
    the max gives exp(-100) = 3.7e-44 (a float32 subnormal) as eager does, not 0."""
    x = torch.randn(6, 4096, device="cuda")
    x[:, 7] = 20.0
    x[:, 100:110] = -80.0 - torch.arange(10, device="cuda") * 2.0  # -80 .. -98 below 20: subnormal
    x[3] = float("-inf")
    x[3, 5] = 0.0
    out = ember.compile(lambda x: torch.softmax(x, -1), options={"gpu_backend": "cuda"})(x)
    ref = torch.softmax(x, -1)
    torch.testing.assert_close(out, ref, atol=0, rtol=2e-6)
    assert torch.equal(out > 0, ref > 0)
    for dtype in (torch.bfloat16, torch.float32):
        check(written_softmax, x.to(dtype), options={"gpu_backend": "cuda"})


@pytest.mark.skipif(DEVICE != "cuda", reason="runs CUDA kernels: EMBER_TEST_DEVICE=cuda on a GPU machine")
def test_float32_division_matches_div_full_bit_for_bit_on_the_gpu():
    """ember_div_full spells out div.full.f32 (scaled operands, an approximate reciprocal) so a
    loop-invariant divisor's part is computed once; its quotients are div.full's, as Triton's
    approximate float32 division (tl.math.fdiv, ieee_rounding=False) computes it, over the whole
    range. (ember's Triton kernels divide float32 as IEEE does: the reference is a kernel here.)"""
    import triton
    import triton.language as tl

    @triton.jit
    def div_full(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        a, b = tl.load(a_ptr + i, mask=i < n), tl.load(b_ptr + i, mask=i < n, other=1.0)
        tl.store(out_ptr + i, tl.math.fdiv(a, b, ieee_rounding=False), mask=i < n)

    special = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 1.0, 3.0,
                            2.0**126, 2.0**126 * 1.5, 2.0**127, 3.4028235e38, float("inf"), float("-inf"),
                            float("nan")], device="cuda")
    a = torch.cat([special.repeat_interleave(len(special)), torch.randn(4096, device="cuda") * 1e30,
                   torch.randn(4096, device="cuda") * 1e-36])
    b = torch.cat([special.repeat(len(special)), torch.randn(4096, device="cuda") * 1e-30,
                   torch.randn(4096, device="cuda") * 1e37])
    cuda_q = ember.compile(lambda a, b: a / b, options={"gpu_backend": "cuda"})(a, b)
    triton_q = torch.empty_like(a)
    div_full[(triton.cdiv(a.numel(), 1024),)](a, b, triton_q, a.numel(), BLOCK=1024)
    same = (cuda_q.view(torch.int32) == triton_q.view(torch.int32)) | (cuda_q.isnan() & triton_q.isnan())
    assert bool(same.all()), (a[~same][:8], b[~same][:8], cuda_q[~same][:8], triton_q[~same][:8])
