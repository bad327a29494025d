"""float16 and bfloat16 tensors on the CPU backend: results as eager's, found by a bug hunt."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import ember

from .helpers import TOLERANCES, check

HALF = [torch.float16, torch.bfloat16]


def test_isnan_of_a_chain_that_overflows_in_float16():
    # eager rounds each op: 1000 * 100 is inf in float16, and inf - inf is NaN
    x = torch.tensor([1000.0, -3.0, 0.5, 700.0, -900.0], dtype=torch.float16)
    check(lambda a: (a * 100 - a * 100).isnan(), x)
    check(lambda a: torch.nan_to_num(a * 100 - a * 100, nan=7.0), x)


def test_huber_and_soft_margin_losses_take_the_inputs_dtype():
    # eager's kernels write the elementwise loss into a tensor like the input (then reduce it)
    x = torch.randn(7, 33, dtype=torch.float16)
    t32, t16 = torch.randn(7, 33), torch.randn(7, 33, dtype=torch.bfloat16)
    check(lambda a, b: F.huber_loss(a, b, delta=0.5), x, t32)
    check(lambda a, b: F.huber_loss(a, b, reduction="none"), x, t16)
    check(lambda a, b: F.soft_margin_loss(a, b.sign(), reduction="sum"), x, t32)
    check(lambda a, b: F.huber_loss(a, b), t32, t32.double())


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_values_a_jump_reads_from_a_buffer_are_rounded_as_eager_holds_them(dtype):
    # values rounded once instead of op by op are an ulp off here and there: a sort or a
    # max_pool of them orders ties otherwise, and a comparison in the next kernel gives other bools
    torch.manual_seed(0)
    x = torch.randn(16, 300).to(dtype)
    y = x.flip(1)
    check(lambda a, b: (torch.sort(a * b + a, 1), torch.topk(a * b - b, 50, 1)), x, y)
    check(lambda a, b: F.max_pool1d((a * b + a).unsqueeze(0), 3, 2, return_indices=True), x, y)
    check(lambda a, b: (a * b + a, (a * b + a).t().contiguous() > 0.25), x, y)


_STRIP_CASES = {
    # pointwise: lengths 0 and 1, a tail shorter than 8 and one past the last full strip (128)
    "pointwise": (lambda a, b: torch.relu(a) + b * 2 + 1, [(0,), (1,), (7,), (129,), (3, 300)]),
    "broadcast": (lambda a, b: a * b[0] - 1, [(5, 131)]),
    "transposed read": (lambda a, b: (a.t() * b.t()).contiguous(), [(130, 9)]),
    "shifted reads": (lambda a, b: a[..., 1:] - a[..., :-1] * b[..., 1:], [(3, 257)]),
    "row sum and max": (lambda a, b: (a.sum(-1), a.amax(-1), (a * b).argmax(-1)), [(4, 1025), (2, 3)]),
    "whole-tensor reductions": (lambda a, b: (a.sum(), a.amax(), a.argmax()), [(70001,)]),
    "layer_norm": (lambda a, b: F.layer_norm(a, a.shape[-1:], b[0], b[1]), [(6, 200)]),
    "softmax": (lambda a, b: torch.softmax(a * 2, -1), [(5, 1000)]),
    # column tiles (codegen/cpp_columns.py): the simd loops run along a row's columns
    "column sums": (lambda a, b: (a.sum(0), (a * b).amax(0), a.var(0)), [(300, 1030), (3, 7)]),
    "middle-dim sums": (lambda a, b: a.sum(1) * b[:, 0] + 1, [(5, 17, 129)]),
}


@pytest.mark.parametrize("case, dynamic", [(case, False) for case in _STRIP_CASES] + [
    (case, True) for case in ("pointwise", "row sum and max", "column sums")])  # (symbolic sizes)
def test_float16_rows_convert_a_strip_at_a_time(case, dynamic):
    # loops that read or write float16 at consecutive elements convert a strip of them at a time
    # (F16C, codegen/cpp_staging.py): every shape, length and access pattern against eager
    fn, shapes = _STRIP_CASES[case]
    torch.manual_seed(0)
    staged = False
    for shape in shapes:
        a = torch.randn(shape, dtype=torch.float16) * 3
        b = torch.randn(shape, dtype=torch.float16)
        report = check(fn, a, b, dynamic=dynamic)
        staged |= any("_row_to_f" in k.source for k in report.kernels)
    assert staged


def _rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name, fn, shared, own", [
    ("layer_norm", lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b), 2, 1),  # its row read 3 times
    ("softmax", lambda x, w, b: torch.softmax(x * 2, -1), 0, 1),  # read twice, nothing shared
    ("rms_norm", lambda x, w, b: _rms_norm(x, w) + b, 2, 0),  # read twice beside shared rows
])
def test_float16_rows_read_again_or_alike_in_every_row_are_converted_once(name, fn, shared, own, dynamic):
    # a row kernel converts a float16 weight once before its rows, and a row its loops read again
    # once at the row's start (codegen/cpp_staging.py); lengths 1, a strip's tail, 1000 and 4100
    torch.manual_seed(0)
    for rows, n in [(3, 1), (5, 129), (7, 1000), (2, 4100)]:
        x = torch.randn(rows, n, dtype=torch.float16) * 3
        w, b = torch.randn(n, dtype=torch.float16), torch.randn(n, dtype=torch.float16)
        report = check(fn, x, w, b, dynamic=dynamic)
        if n == 1:  # (rows of one: a pointwise kernel)
            continue
        source = "".join(k.source for k in report.kernels if "row_to_f32" in k.source)
        assert source.count("ember_scratch_row<float, 1>") == own, source
        assert source.count("ember_scratch_row<float, 16>") + source.count("ember_scratch_row<float, 17>") == shared


def test_float16_rows_converted_once_in_a_kernel_writing_them_in_place():
    # the row is converted before any loop and written by the last one: every read sees the row
    # as it was, as eager's (and the runtime may hand the input's memory to the output)
    x = torch.randn(6, 300, dtype=torch.float16)
    report = check(lambda a: a.sub_(a.mean(-1, keepdim=True)).mul_(a.amax(-1, keepdim=True)), x)
    assert "converted to float once" in "".join(k.source for k in report.kernels)


def test_float16_strips_write_in_place_and_beside_other_dtypes():
    x = torch.randn(300, dtype=torch.float16)
    report = check(lambda a, b: (a.mul_(3), a.float() * b, (b * 2).half()), x, torch.randn(300))
    source = "".join(k.source for k in report.kernels)
    assert "ember_f32_row_to_f16(" in source and "ember_f16_row_to_f32(" in source


def _bn_relu_step(x, w, b, rm, rv, g):
    y = torch.relu(F.batch_norm(x, rm, rv, w, b, training=True))
    return (y, *torch.autograd.grad(y, (x, w, b), g))


@pytest.mark.parametrize("dtype", HALF)
def test_bool_masks_beside_16_bit_values_leave_the_loops_vectorized(dtype, tmp_path):
    """A relu's mask (bool) loaded or stored in a simd loop with 16-bit values: GCC 12 left the
    loop scalar ("no vectype", a BatchNorm's training step 10x slower than eager) until bools
    were loaded as bytes and stored through a select (codegen/cstyle.py: bools_as_bytes)."""
    x = (torch.randn(2, 16, 5, 6) * 2).to(dtype).contiguous(memory_format=torch.channels_last)
    g = torch.randn(x.shape).to(dtype).contiguous(memory_format=torch.channels_last)
    args = (x.requires_grad_(), torch.rand(16) + 0.5, torch.randn(16), torch.zeros(16), torch.ones(16), g)
    args[1].requires_grad_()
    args[2].requires_grad_()
    report = check(_bn_relu_step, *args, rtol=2e-2, atol=2e-2)
    masked = [k for k in report.kernels if "bool" in k.source.split("{")[0]]
    assert len(masked) == 2, [k.name for k in report.kernels]  # the forward stores the mask, the backward reads it
    assert not _loops_left_scalar(masked, tmp_path)


def _loops_left_scalar(kernels, tmp_path) -> list[str]:
    """GCC 12's "no vectype" lines for these kernels' sources compiled with ember's flags (none
    where there is no GCC)."""
    import subprocess

    from ember.codegen.cpp_prelude import PRELUDE
    from ember.config import Config

    from .test_max_pool import _gcc

    if _gcc() is None:
        return []
    path = tmp_path / "kernels.cpp"
    path.write_text(PRELUDE + "\n" + "\n".join(k.source for k in kernels))
    proc = subprocess.run([_gcc(), *Config().cxx_flags, "-fopenmp", "-std=c++17", "-c", "-fopt-info-vec-missed",
                           str(path), "-o", str(tmp_path / "kernels.o")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith(str(path)) and "no vectype" in line]


@pytest.mark.parametrize("dtype", HALF)
def test_bools_kept_between_column_loops_leave_them_vectorized(dtype, tmp_path):
    """A column kernel keeps each column's values between its loops in arrays: a bool kept so
    left the loop reading it back scalar beside 16-bit values (GCC 12, "no vectype"), until
    bools were kept as bytes (codegen/cpp_columns.py: _kept_type)."""

    def repaired_mean(x):  # (a variance's mean repaired by its mean deviation, unless infinite)
        m = x.float().mean(0)
        return torch.where(torch.isinf(m), m, m + (x - m).sum(0) / x.shape[0])

    x = (torch.randn(60, 16) * 3).to(dtype)
    x[3, 2] = float("inf")
    report = check(repaired_mean, x)
    (kernel,) = report.kernels
    assert "uint8_t v" in kernel.source and "// columns" in kernel.source, kernel.source
    assert not _loops_left_scalar([kernel], tmp_path)


@pytest.mark.parametrize("dtype", HALF)
def test_a_value_a_conversion_reads_rounded_is_read_rounded_by_all(dtype):
    # std's backward, (e - e.float().mean(0).to(dtype)) / std: the mean's conversion read e
    # rounded, the subtraction read it unrounded, and over two rows an ulp apart the difference
    # was that ulp: a float16 gradient 20% off where eager's is within 3% (CPU fuzz seed
    # 240857403881)
    torch.manual_seed(0)
    x = torch.randn(2, 129).to(dtype)
    up = torch.randn(1, 129).to(dtype)

    def grad(fn, x):
        x = x.clone().requires_grad_()
        return torch.autograd.grad(fn(x), x, up)[0]

    def fn(x):
        return torch.exp(x).std(dim=0, keepdim=True, correction=0)

    ref = grad(fn, x)
    got = grad(ember.compile(fn), x)
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_a_float32_min_of_a_16_bit_chain_is_one_its_backward_recomputes(dtype, layout):
    # (x * rsqrt(ms)).float() * w, an RMSNorm with a float32 weight, then its min per row: the
    # forward's min read the unrounded rsqrt, its backward recomputed the products from the
    # rounded rsqrt it saved, and x == min matched nothing in some rows: NaN gradients (CPU fuzz
    # seed 320218832278, bfloat16)
    def fn(x, w):
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w).amin(dim=1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 7, generator=g).to(dtype)
    if layout == "columns":
        x = x.t().contiguous().t()
    w = torch.randn(7, generator=g) * 3
    up = torch.randn(64, 1, generator=g)
    mine, ref = (x.clone().requires_grad_() for _ in range(2))
    ember.compile(fn)(mine, w).backward(up)
    fn(ref, w).backward(up)
    assert not mine.grad.isnan().any()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(mine.grad, ref.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_a_comparison_rounds_the_16_bit_ops_under_a_float32_op_as_the_min_it_meets(dtype, layout):
    # lerp computes in float32 between two 16-bit ops: log(|x| + 1e-3), then the lerp's cast
    # back. The forward's min rounded the sum before the log; the backward's x == min rounded
    # only the lerp's cast, not the sum under its float32 ops, and in 16 of 128 columns no
    # element equalled the min: NaN gradients (float16 CPU fuzz seed 104247131677)
    def fn(x):
        return torch.lerp(x, torch.log(x.abs() + 1e-3).to(x.dtype), 0.3).amin(dim=0, keepdim=True)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, generator=g).to(dtype)
    if layout == "columns":
        x = x.t().contiguous().t()
    up = torch.randn(1, 128, generator=g).to(dtype)
    mine, ref = (x.clone().requires_grad_() for _ in range(2))
    ember.compile(fn)(mine).backward(up)
    fn(ref).backward(up)
    assert not mine.grad.isnan().any()
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(mine.grad, ref.grad, rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", HALF)
def test_a_value_a_returned_max_is_taken_over_is_stored_as_the_max_read_it(dtype):
    # v = a label-smoothed cross-entropy per row, returned with v / (|v|.amax() + 1). The
    # forward's max rounded v op by op (as eager, for its backward's v == max), while v itself
    # left the graph rounded once; in 6 of 20 bfloat16 batches no stored |v| equalled the max,
    # and the backward divided by that count: NaN gradients (CPU fuzz seed 30966434902)
    def fn(x, t):
        v = F.cross_entropy(F.hardtanh(x, -0.5, 1.0) * x, t, reduction="none", label_smoothing=0.1)
        return v / (v.abs().amax(-1, keepdim=True) + 1), v

    compiled = ember.compile(fn)
    for seed in range(8):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(7, 128, generator=g) * 3).to(dtype)
        t = torch.randint(0, 128, (7,), generator=g)
        t[5] = -100
        up = torch.randn(7, generator=g)
        mine, ref = (x.clone().requires_grad_() for _ in range(2))
        (compiled(mine, t)[0].float() * up).sum().backward()
        (fn(ref, t)[0].float() * up).sum().backward()
        assert not mine.grad.isnan().any(), seed
        rtol, atol = TOLERANCES[dtype]
        torch.testing.assert_close(mine.grad, ref.grad, rtol=rtol, atol=atol)


def test_a_16_bit_value_a_training_forward_saves_is_read_rounded_by_it_too():
    # an RMSNorm's rsqrt is saved for the backward, rounded; the forward's x * rsqrt read it
    # unrounded. Normalized over a dim of size 1, the gradient is 0 by cancellation of terms the
    # forward's norm and the backward's recomputed product must agree on: it came out 14 where
    # eager's is within 1e-4 (CPU fuzz seed 58612926972). (bfloat16: eager's float16 overflows)
    dtype = torch.bfloat16

    def fn(x, w):
        return F.normalize(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, dim=2)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 1, 1, 1000, generator=g).to(dtype)
    w = (torch.randn(1000, generator=g) * 3).half()
    up = torch.randn(17, 1, 1, 1000, generator=g)
    grads = []
    for f, cast in ((fn, dtype), (ember.compile(fn), dtype), (fn, torch.float64)):
        a = x.to(cast).clone().requires_grad_()
        b = w.to(cast if cast == torch.float64 else w.dtype).clone().requires_grad_()
        f(a, b).backward(up.to(torch.float64 if cast == torch.float64 else torch.float32))
        grads.append([a.grad.double(), b.grad.double()])
    for eager, mine, exact in zip(*grads):
        assert (mine - exact).abs().max() <= 2 * (eager - exact).abs().max() + 1e-3


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_value_the_backward_recomputes_is_read_as_it_in_the_forward_too(dtype, dynamic):
    # layer_norm(cos(x) ** 2) over one element: its gradient is 0 where the backward's x - mean
    # is, that is where the backward's recomputed cos(x) ** 2 is the forward's. The backward
    # squared the rounded cos (which it reads for pow's gradient, as eager saved it), the forward
    # the unrounded one: an ulp apart, times rstd (316), gradients of 600 where eager's are 0
    # (CPU fuzz seed 372043163940)
    def fn(x):
        return F.layer_norm(torch.cos(x).pow(2), (1,))

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 33, 1, generator=g) * 3).to(dtype)
    up = torch.randn(2, 33, 1, generator=g)
    mine, ref = (x.clone().requires_grad_() for _ in range(2))
    (ember.compile(fn, dynamic=dynamic)(mine).float() * up).sum().backward()
    (fn(ref).float() * up).sum().backward()
    torch.testing.assert_close(mine.grad, ref.grad, rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, 1700.0), (torch.float16, 10000.0)])
@pytest.mark.parametrize("loss_inside", [False, True], ids=["output", "loss"])
def test_a_forward_value_the_backward_recomputes_is_read_as_eager_saved_it(dtype, scale, loss_inside):
    # logcumsumexp's backward is exp(reversed_logcumsumexp(log|g| - out) + x * c): bounded only
    # where x * c is the rounded value the forward's out was computed from. The backward
    # recomputed x * c unrounded, up to half an ulp (16 at 5000 in bfloat16) above out: exp of
    # that, gradients of 10^6 where eager's are 10^3 (CPU fuzz seed 9801). (The loss inside the
    # function too: its backward starts from a gradient of 1.)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 129, generator=g).to(dtype)
    up = torch.randn(17, 129, generator=g).to(dtype)

    def fn(a, c):
        y = torch.logcumsumexp(a * c, 0)
        return (y * up).sum() if loss_inside else y

    grads = []
    for f, cast in ((fn, dtype), (ember.compile(fn), dtype), (fn, torch.float64)):
        a = x.to(cast).clone().requires_grad_()
        c = torch.tensor(scale, dtype=cast, requires_grad=True)
        out = f(a, c)
        out.backward(None if loss_inside else up.to(cast))
        grads.append([a.grad.double(), c.grad.double()])
    for eager, mine, exact in zip(*grads):
        assert (mine - exact).abs().max() <= 2 * (eager - exact).abs().max() + 1e-3


@pytest.mark.parametrize("train", [False, True])
def test_a_conversion_and_a_comparison_of_one_value_read_the_same_rounding(train):
    # bf16 y = exp(x * 0.5 + x.flip(-1)); y.half().bfloat16() >= y is True everywhere in eager.
    # The comparison read y rounded op by op (x * 0.5 + x.flip(-1) rounded before the exp), the
    # conversion only y itself rounded: an ulp apart, 14 of 129 came out False (CPU fuzz seed
    # 91561381188)
    def fn(x):
        y = torch.exp(x * 0.5 + x.flip(-1))
        return F.leaky_relu(y, 0.1), y.to(torch.float16).to(y.dtype) >= y

    g = torch.Generator().manual_seed(0)
    x = ((torch.randperm(129, generator=g).float() - 64.5) * (4 / 129)).bfloat16()
    out, ref = ember.compile(fn)(x.clone().requires_grad_(train)), fn(x.clone().requires_grad_(train))
    assert torch.equal(out[1], ref[1])


def test_a_saved_value_a_comparison_reads_is_read_as_stored_by_the_forward():
    # bf16 s = softsign(x), saved for the backward and compared (s >= maximum(s, x)), so stored
    # rounded op by op (1 + |x| rounded before the division): the maximum read s rounded once
    # instead, the comparison the stored s, and 109 of 1452 came out False where eager's are
    # True (CPU ragged fuzz seed 163810406837)
    def fn(x):
        s = F.softsign(x)
        m = torch.maximum(s, x)
        return s, s >= m, torch.tanh(m)

    x = torch.randn(33, 44, generator=torch.Generator().manual_seed(0)).bfloat16()
    out, ref = ember.compile(fn)(x.clone().requires_grad_()), fn(x.clone().requires_grad_())
    assert torch.equal(out[1], ref[1])
    assert torch.equal(out[0], ref[0]) and torch.equal(out[2], ref[2])


def test_a_rounded_value_stored_along_rows_it_was_carried_into_builds():
    # a bf16 mean's backward stores g / n across the rows beside its column sum: the store
    # converted the rounding's float32 source, which the loop over the rows did not carry (an
    # undeclared variable: the kernel failed to build and its ops ran through ATen; CPU fuzz
    # seed 363425026600)
    def fn(x, w, b):
        return F.linear(x, w, b).mean(dim=-2)

    torch.manual_seed(0)
    args = [torch.randn(4, 100, dtype=torch.bfloat16), torch.randn(33, 100, dtype=torch.bfloat16),
            torch.randn(33, dtype=torch.bfloat16)]
    g = torch.randn(33, dtype=torch.bfloat16)
    mine, theirs = ([a.clone().requires_grad_() for a in args] for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = torch.autograd.grad(ember.compile(fn, dynamic=True)(*mine), mine, g)
    ref = torch.autograd.grad(fn(*theirs), theirs, g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1.6e-2, atol=1e-2)


def _row_max_beside_rounded_selects(x, mask):
    v = x.masked_fill(x == 0, 0.0)  # (two chained selects, stored rounded to bfloat16)
    count = torch.count_nonzero(mask, 1)
    scaled = x.div_(x.abs().amax(-1, keepdim=True) + 1)
    return count, scaled, v.clamp_min(0.25)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_a_row_max_beside_a_rounded_store_of_two_selects(dynamic):
    # (CPU fuzz seed 11574934379) GCC 12 at -O3 with -fno-trapping-math: jump threading
    # miscompiled the omp simd loop reducing the row max and the count beside the bfloat16 store
    # of the clamp: the counts came back as garbage, the maxima wrong, and variants crashed. The
    # default flags turn it off (-fno-thread-jumps, config.py).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(17, 1000, generator=g).bfloat16()
    mask = torch.zeros(18, 1000, dtype=torch.bool)[1:]
    want = _row_max_beside_rounded_selects(x.clone(), mask)
    got = ember.compile(_row_max_beside_rounded_selects, dynamic=dynamic)(x.clone(), mask)
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
    for w, o in zip(want[1:], got[1:]):  # (ember rounds amax + 1 once, in the division)
        torch.testing.assert_close(o, w)
