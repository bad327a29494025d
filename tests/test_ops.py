"""Every op ember generates, against eager, on PyTorch's own OpInfo samples.

One compiled function runs all of an op's float32 samples, a second a varied few of every other
dtype's (``check_op``), so each case is two builds.
Samples cover scalars, size-0/size-1 dims, broadcasting and non-contiguous inputs where the
OpInfo provides them; test_shapes.py adds the awkward cases OpInfo leaves out.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten

import ember

from .conftest import DEVICE
from .helpers import (
    assert_clean,
    assert_same,
    check,
    compile_checked,
    flatten,
    on_the_interpreter,
    program_of_samples,
    run,
)

UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
         "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
         "acosh", "atanh", "sigmoid", "erf", "erfc", "floor", "ceil", "round", "trunc", "sign",
         "logical_not", "bitwise_not", "isnan", "isinf", "square", "frac", "nan_to_num",
         "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.hardtanh",
         "nn.functional.leaky_relu", "nn.functional.elu", "nn.functional.softplus",
         "nn.functional.hardswish", "nn.functional.hardsigmoid", "nn.functional.mish"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "maximum",
          "minimum", "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
          "bitwise_right_shift", "where", "clamp", "clamp_min", "clamp_max", "masked_fill", "lerp",
          "addcmul", "rsub", "true_divide", "xlogy", "nn.functional.mse_loss", "gather", "take_along_dim", "scatter"]
REDUCTIONS = ["sum", "prod", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
              "var", "std", "var_mean", "logsumexp", "softmax", "log_softmax",
              "nn.functional.layer_norm", "nn.functional.normalize", "nn.functional.batch_norm",
              "nn.functional.group_norm", "nn.functional.cross_entropy", "nn.functional.nll_loss"]
# Indexing ops: generated where ember can (searchsorted over 1-d sequences, index_select on dim 0,
# writes at indices in the dtypes atomics take), through ATen elsewhere; either way equal to eager.
INDEXING = ["index_select", "searchsorted", "bucketize", "take", "index_put", "index_add", "scatter_add",
            "scatter_reduce"]
VIEWS = ["cat", "constant_pad_nd", "nn.functional.pad",
         "expand", "permute", "reshape", "view", "transpose", "t", "squeeze", "unsqueeze", "narrow",
         "select", "split", "unbind", "flatten", "movedim"]

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
          torch.uint8, torch.bool]
# Ops ember must turn into kernels (not only ATen calls) for float32.
MUST_GENERATE = set(UNARY + BINARY + REDUCTIONS) - {"round", "nn.functional.batch_norm"}

OPS = [op for op in op_db if op.name in set(UNARY + BINARY + REDUCTIONS + VIEWS + INDEXING)
       and set(DTYPES) & set(op.supported_dtypes("cpu"))]


def _id(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _samples(op, dtype):
    samples = []
    for s in op.sample_inputs(DEVICE, dtype, requires_grad=False):
        flat, spec = tree_flatten((s.input, s.args, s.kwargs))
        tensors = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        samples.append((flat, spec, tensors, s.output_process_fn_grad))
    return samples[:12]


# float32 runs every sample (up to 12); each other dtype the few that between them show every kind
# of input float32's do: tracing costs in proportion to the samples, and the other dtypes' kernels
# differ from float32's in their element types, not in how they index.
OTHER_DTYPE_SAMPLES = 5


def _kinds(sample) -> set:
    """What is awkward about a sample's inputs: empty or 0-d tensors, strides that are not
    contiguous, shapes that broadcast, the number of dims, and the non-tensor arguments' layout."""
    flat, spec, positions, _ = sample
    tensors = [flat[p] for p in positions]
    kinds = {("dims", max((t.dim() for t in tensors), default=0)), ("spec", str(spec))}
    kinds |= {("empty",) for t in tensors if t.numel() == 0}
    kinds |= {("0-d",) for t in tensors if t.dim() == 0}
    kinds |= {("strided",) for t in tensors if not t.is_contiguous()}
    if len({tuple(t.shape) for t in tensors}) > 1:
        kinds.add(("broadcast",))
    return kinds


def _varied(samples: list, limit: int) -> list:
    """Up to ``limit`` of ``samples``, in their order, picked greedily to show the most kinds of
    input (``_kinds``) between them."""
    kinds = [_kinds(s) for s in samples]
    chosen: list[int] = []
    seen: set = set()
    while len(chosen) < min(limit, len(samples)):
        best = max((i for i in range(len(samples)) if i not in chosen), key=lambda i: (len(kinds[i] - seen), -i))
        chosen.append(best)
        seen |= kinds[best]
    return [samples[i] for i in sorted(chosen)]


def _program(op, samples):
    """f(*tensors) applying the op to every sample (non-tensor arguments baked in)."""
    return program_of_samples(op.op, [(flat, spec, positions) for flat, spec, positions, _ in samples], _id(op))


@pytest.mark.parametrize("op", OPS, ids=_id)
def test_op_matches_eager(op):
    check_op(op, [d for d in DTYPES if d in op.supported_dtypes(DEVICE)])


def check_op(op, dtypes, options=None):
    """Run every OpInfo sample of ``op`` for each dtype through ember and compare with eager.
    float32's samples run as one program, every other dtype's together as a second: one trace
    and one build for all of them costs half of one per dtype, and a failure is named by the
    dtype of its samples (a graph that fails to compile is then run one dtype at a time)."""
    groups = [[d for d in dtypes if d == torch.float32], [d for d in dtypes if d != torch.float32]]
    for group in groups:
        per_dtype = [(d, _samples(op, d) if d == torch.float32 else _varied(_samples(op, d), OTHER_DTYPE_SAMPLES))
                     for d in group]
        per_dtype = [(d, samples) for d, samples in per_dtype if samples]
        if not per_dtype:
            continue
        report = _check_samples(op, per_dtype, options)
        if group == [torch.float32] and op.name in MUST_GENERATE:
            assert report.kernels, f"{_id(op)}: no kernel generated; ATen ran {report.fallbacks}"


def _check_samples(op, per_dtype, options) -> ember.Report:
    samples = [s for _, dtype_samples in per_dtype for s in dtype_samples]
    tensors = [flat[p] for flat, _, positions, _ in samples for p in positions]
    fn = _program(op, samples)
    ref = fn(*[t.clone() for t in tensors])
    fallbacks = ember.stats()["graph_fallbacks"]
    out, report = run(fn, *[t.clone() for t in tensors], options=options)
    # (a graph torch could not trace runs eagerly: right, with a warning, and nothing compiled)
    eager = ember.stats()["graph_fallbacks"] - fallbacks
    if DEVICE != "cpu":  # a second call takes the launchers' fast path
        out = run.last_compiled(*[t.clone() for t in tensors])
    dtypes = ", ".join(str(d).replace("torch.", "") for d, _ in per_dtype)
    errors = [g.error for g in report.graphs if g.error]
    failed = [k.name for k in report.kernels if not k.built]
    if (errors or failed or eager) and len(per_dtype) > 1:
        for one in per_dtype:  # (which dtype's samples it was)
            _check_samples(op, [one], options)
    assert not errors, f"{_id(op)} [{dtypes}]: graph not compiled: {errors}"
    assert not eager, f"{_id(op)} [{dtypes}]: the whole graph ran eagerly (see its warning)"
    assert not failed, f"{_id(op)} [{dtypes}]: kernels failed to build: {failed}"
    first = 0
    for dtype, dtype_samples in per_dtype:
        span = slice(first, first + len(dtype_samples))
        first += len(dtype_samples)
        try:
            assert_same(out[span], ref[span])
        except AssertionError as e:
            if dtype in (torch.bfloat16, torch.float16) and _no_further_from_float64(
                    out[span], ref[span], fn, tensors, span):
                continue  # (eager's own rounding differs: torch 2.11's bfloat16 batch_norm on the CPU)
            raise AssertionError(f"{_id(op)} [{dtype}]: {e}") from None
    return report


def _no_further_from_float64(out, ref, fn, tensors, span) -> bool:
    """Is each of ember's 16-bit outputs, where it differs from eager's, no further from the
    float64 run of the same samples than eager's (same shapes, same non-finite elements)?"""
    wide = fn(*[t.double() if t.is_floating_point() else t.clone() for t in tensors])[span]
    for o, r, w in zip(flatten(out), flatten(ref), flatten(wide)):
        if not (isinstance(r, torch.Tensor) and r.dtype.is_floating_point):
            continue
        if not (isinstance(w, torch.Tensor) and o.shape == r.shape == w.shape and o.dtype == r.dtype):
            return False
        o64, r64, w64 = o.double(), r.double(), w.double()
        if not torch.equal(torch.isfinite(o64), torch.isfinite(r64)):
            return False
        finite = torch.isfinite(o64) & torch.isfinite(w64)
        if finite.any() and (o64 - w64)[finite].abs().max() > (r64 - w64)[finite].abs().max():
            return False
    return True


SPECIAL_OPS = {
    "sign": torch.sign, "sgn": torch.sgn, "abs": torch.abs, "relu": torch.relu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "floor": torch.floor,
    "clamp": lambda x: x.clamp(-1, 1), "nan_to_num": torch.nan_to_num, "isnan": torch.isnan,
    "maximum": lambda x: torch.maximum(x, x.flip(0)), "minimum": lambda x: torch.minimum(x, x.flip(0)),
}


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_special_values_match_eager(dtype, target):
    # NaN, infinities and signed zeros: sign(nan) is 0 in eager, and was NaN in ember (a masked
    # L1 loss over targets with NaN holes then had NaN gradients where eager's are 0)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.5, -2.0, 3e38], dtype=dtype,
                     device=DEVICE)
    ops = list(SPECIAL_OPS.values())
    fn = lambda x: [op(x) for op in ops]  # noqa: E731
    out, report = run(fn, x, options={"target": target} if target else None)
    assert not [g.error for g in report.graphs if g.error]
    for name, o, r in zip(SPECIAL_OPS, out, fn(x)):
        try:
            assert_same(o, r)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_products_and_quotients_read_a_0d_tensor_of_another_dtype_in_float32(dtype):
    # eager's CPU kernels (and its GPU kernels, for a CPU scalar) read a 0-d second operand of
    # another dtype as a float32 scalar; rounded to 16 bits first, 1e5 became inf and a masked
    # mean's count of 100000 gave 0
    x = torch.tensor([1.0, 2.0, -0.3, 0.5, 1.2314453125, 3.5, 7.0], dtype=dtype, device=DEVICE)
    scalars = [torch.tensor(100000), torch.tensor(1e5, dtype=torch.float64), torch.tensor(3.3), torch.tensor(0.1)]
    fn = lambda x, s: [x * s, x / s, x // s, torch.div(x, s, rounding_mode="trunc"), (x.exp() * s).sum()]  # noqa: E731
    for s in scalars:
        out, report = run(fn, x, s)
        assert not [g.error for g in report.graphs if g.error]
        assert_same(out, fn(x, s))
    valid = torch.ones(100000, dtype=dtype, device=DEVICE)
    masked_mean = lambda v: (v * (v > 0)).sum() / (v > 0).sum()  # noqa: E731
    assert_same(run(masked_mean, valid)[0], masked_mean(valid))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_remainders_by_python_floats_round_the_float(dtype):
    # eager takes x % 0.1 with 0.1 rounded to the tensor's dtype: 1000 % 0.1 is 0.044 in float16
    x = torch.tensor([1000.0, 3.0, -7.5, 0.25], dtype=dtype, device=DEVICE)
    fn = lambda x: [x % 0.1, torch.fmod(x, 0.3), torch.remainder(x, -0.7), 3.7 % x]  # noqa: E731
    out, report = run(fn, x)
    assert not [g.error for g in report.graphs if g.error]
    assert_same(out, fn(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_tensors_compare_with_python_floats_rounded_to_16_bits(dtype):
    # eager rounds the float to the tensor's dtype before comparing (bf16 0.3 == 0.3); compared
    # in float32 with the float as written, masks (and hardshrink) came out different
    x = torch.tensor([0.1, 0.3, 0.7, -0.3, 0.5], dtype=dtype, device=DEVICE)
    fn = lambda x: [x == 0.3, x != 0.7, x > 0.1, x <= -0.3, x.masked_fill(x > 0.1, 0),  # noqa: E731
                    torch.nn.functional.hardshrink(x, 0.3)]
    out, report = run(fn, x)
    assert not [g.error for g in report.graphs if g.error]
    assert_same(out, fn(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_chains_read_by_a_jump_round_per_op_by_a_float_conversion_once(dtype):
    # a jump (round, a comparison) reads the chain as eager holds it, each op rounded; a
    # conversion to float32 reads the chain's float32 value rounded once (docs/architecture.md,
    # Numerics), so what else reads the chain shares its computation
    a, b, c = (torch.randn(4096, dtype=dtype, device=DEVICE) * 100 for _ in range(3))
    jumps = lambda a, b, c: [((a + b) * c).round(), (a + b) * c > 300]  # noqa: E731
    out, _ = run(jumps, a, b, c)
    for o, r in zip(out, jumps(a, b, c)):
        assert torch.equal(o, r)
    (out,), _ = run(lambda a, b, c: [((a + b) * c).float()], a, b, c)
    once = ((a.float() + b.float()) * c.float()).to(dtype).float()
    assert torch.equal(out, once)
    per_op = ((a + b) * c).float()
    assert not torch.equal(once, per_op)  # (the inputs tell the two apart)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_sums_with_python_floats_add_them_as_eager_does(dtype):
    # eager's CPU kernels round the float to 16 bits before adding (bf16 1.703 + 1000.3 is 1000,
    # not 1004); its GPU kernels take it as written, as products and quotients do everywhere
    x = torch.randn(4096, dtype=dtype, device=DEVICE) * 10
    for s in (0.1, 3.3, 1000.3, -7.77):
        fn = lambda x: [x + s, x - s, s - x, x * s]  # noqa: E731,B023
        # (floats as written: Dynamo would pass a changed one as a 0-d float32 tensor, which
        # ATen's GPU kernels read rounded to 16 bits, unlike the float)
        with torch._dynamo.config.patch(specialize_float=True):
            out, report = run(fn, x)
        assert not [g.error for g in report.graphs if g.error]
        for o, r in zip(out, fn(x)):
            assert torch.equal(o, r), (s, (o.float() - r.float()).abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_tensors_meet_python_ints_and_alphas_as_in_eager(dtype):
    # a Python int is a number like a float: eager rounds it to 16 bits where it rounds floats
    # (float16 2048 == 2049 holds; ember compared with 2049 exactly), and CPU sums round alpha
    # (128 elements: eager's own CPU loop gives its last, unvectorized elements another alpha)
    x = torch.tensor([2048., 1., 256., 3000., -130.625], dtype=dtype, device=DEVICE)[torch.arange(128) % 5]
    y = torch.full_like(x, 0.1292724609375)

    def fn(x, y):
        return [x == 2049, x < 2049, x >= 257, x + 2049, x % 2049, torch.add(x, y, alpha=1000.3),
                torch.sub(x, y, alpha=0.1)]

    out, report = run(fn, x, y)
    assert not [g.error for g in report.graphs if g.error]
    for i, (o, r) in enumerate(zip(out, fn(x, y))):
        assert torch.equal(o, r), (i, o, r)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_rounding_division_by_a_scalar_divides_in_float32(dtype):
    # eager divides by a scalar (or, on the CPU, by one broadcast element) in float32 with the
    # scalar unrounded: float16 128.375 // 0.1 is 1283, 16-bit steps gave 1282
    x = (torch.randn(4096, device=DEVICE) * 200).to(dtype)
    one = torch.tensor(0.37, dtype=dtype, device=DEVICE)
    full = (torch.rand(4096, device=DEVICE) + 0.1).to(dtype)

    def fn(x, one, full):
        return [x // 0.1, torch.div(x, 0.1, rounding_mode="trunc"), x // 3, x // one,
                torch.div(x, one, rounding_mode="trunc"), x // full, torch.div(x, full, rounding_mode="trunc")]

    out, report = run(fn, x, one, full)
    assert not [g.error for g in report.graphs if g.error]
    for i, (o, r) in enumerate(zip(out, fn(x, one, full))):
        if i == 0 and DEVICE != "cpu" and dtype == torch.bfloat16:
            # eager's GPU kernel multiplies by the divisor's reciprocal: a bfloat16 quotient
            # near a rounding boundary may land one bfloat16 step away (52 of 4096 on the H200)
            torch.testing.assert_close(o, r, rtol=2 ** -7, atol=0)
            continue
        assert torch.equal(o, r), (i, (o != r).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_powers_by_python_floats_round_the_exponent(dtype):
    # eager converts a scalar exponent to the tensor's dtype (checked): 2.0001 is 2.0 there, so
    # (-3) ** 2.0001 is 9, not nan; float16 ** 1e10 raises "cannot be converted ... overflow"
    x = torch.tensor([2.0, 4.0, -3.0, 0.0, 0.5], dtype=dtype, device=DEVICE)
    for exponent in (2.0001, 1e-8, 0.3, 3, -1.0000001):
        fn = lambda x, e=exponent: x ** e  # noqa: E731
        out, report = run(fn, x)
        assert not [g.error for g in report.graphs if g.error]
        assert torch.equal(out.isnan(), fn(x).isnan()) and torch.equal(out.nan_to_num(), fn(x).nan_to_num()), exponent
    if dtype == torch.float16:
        with pytest.raises(RuntimeError, match="overflow"):
            ember.compile(lambda x: x ** 1e10)(x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_rounding_division_of_a_python_number_rounds_it(dtype):
    # eager's kernels convert a scalar dividend to the tensor's dtype (GPUs too): 70000.0 // x
    # in float16 is inf // x, NaN (ember gave +-inf); bfloat16 rounds 70001 to 70144
    x = torch.tensor([2.0, 4.0, -3.0, 7.0], dtype=dtype, device=DEVICE)
    for fn in (lambda x: 70001.0 // x, lambda x: torch.div(70001.0, x, rounding_mode="trunc"),
               lambda x: torch.div(0.1, x, rounding_mode="floor")):
        out = ember.compile(fn)(x)
        assert torch.equal(out.isnan(), fn(x).isnan()) and torch.equal(out.nan_to_num(), fn(x).nan_to_num())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_products_match_eager(dtype):
    # eager's CPU prod multiplies in the 16-bit type (float16 300 * 300 * 0.001 is inf there;
    # ember's float32 product was 90); its GPU kernels accumulate in float32, as ember's do
    x = torch.cat([torch.tensor([[300.0, 300.0, 0.001]]), torch.rand(7, 3) + 0.5]).to(dtype).to(DEVICE)
    fn = lambda x: x.prod(-1)  # noqa: E731
    out = ember.compile(fn)(x)
    if DEVICE == "cpu":
        assert torch.equal(out, fn(x))
    else:
        assert_same(out, fn(x))


@pytest.mark.skipif(DEVICE != "cpu", reason="GPU kernels contract a * b + c (Triton and NVRTC, as Inductor's)")
def test_products_are_rounded_before_they_are_added():
    # gcc fused a * b - c * d into an FMA: equal products left 1e-8 (eager 0), inf - inf was
    # -inf (eager NaN); the CPU kernels build with -ffp-contract=off
    a, b = torch.tensor([0.1, 1 / 3, 1e30, 0.7]), torch.tensor([0.7, 3.0, 1e10, 0.1])
    for dtype in (torch.float32, torch.float64):
        x, y = a.to(dtype), b.to(dtype)
        fn = lambda a, b, c, d: a * b - c * d  # noqa: E731
        out = ember.compile(fn)(x, y, x.clone(), y.clone())
        assert torch.equal(out.isnan(), fn(x, y, x, y).isnan())
        assert torch.equal(out.nan_to_num(), fn(x, y, x, y).nan_to_num())


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's CPU kernels keep the first of equal values")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_maxima_of_signed_zeros_keep_the_first_as_eager(dtype):
    # relu(-0.0) is -0.0 in eager and max([-0.0, 0.0]) is -0.0; ember's max returned the second
    x = torch.tensor([[0.0, -0.0, 0.0], [-0.0, 0.0, 0.0]], dtype=dtype)
    for fn in (torch.relu, lambda x: torch.clamp(x, min=0), lambda x: torch.max(x, 1).values,
               lambda x: x.amax(1), lambda x: x.amin(1), lambda x: torch.minimum(x, x.flip(1))):
        assert torch.equal(1 / ember.compile(fn)(x), 1 / fn(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rounding_divisions_read_a_16_bit_sum_rounded_as_eager(dtype):
    # (x + 4096) % 5 of x = 1 in float16 is 4096 % 5 = 1 in eager: the sum rounds to 4096 first
    def fn(x, y):
        s = x + 4096
        return s % y, s // y, torch.fmod(s, y), torch.div(s, y, rounding_mode="trunc"), s % 5

    x = torch.tensor([1.0, 3.0, -7.0, 0.5], dtype=dtype, device=DEVICE)
    y = torch.tensor([5.0, 4100.0, 3.0, -6.0], dtype=dtype, device=DEVICE)
    for got, want in zip(ember.compile(fn)(x, y), fn(x, y)):
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_cubes_and_inverse_squares_round_the_square_as_eager(dtype):
    # eager's x ** 3 is x * x * x in the tensor's dtype: bfloat16 17.25 ** 3 is 5152, not 5120
    x = torch.tensor([17.25, -11.25, -5.9375, 0.0, 300.5, -0.01] * 11, dtype=dtype, device=DEVICE)
    fn = lambda x: (x ** 3, x ** -2, x ** 2)  # noqa: E731
    for got, want in zip(ember.compile(fn)(x), fn(x)):
        assert torch.equal(got, want), (got[:6], want[:6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_abs_clears_the_sign_of_zeros_and_nans_as_eager(dtype):
    # abs(-nan) kept its sign bit in the C-style kernels (a NaN fell through the comparisons)
    x = torch.tensor([-0.0, float("nan"), -1.5, 2.0, -float("inf")], dtype=dtype, device=DEVICE)
    x[1] = -x[1]
    fn = lambda x: torch.copysign(torch.ones_like(x), torch.abs(x))  # noqa: E731
    assert torch.equal(ember.compile(fn)(x), fn(x))


@pytest.mark.skipif(DEVICE != "cpu", reason="eager's CPU kernel: a double exponent, computed in double")
def test_float32_powers_by_python_floats_compute_in_double_as_eager():
    # the exponent rounded to float32 (1/3 as 0.33333334) was 7-13 ulp off at 1e30 and 1e-30
    x = torch.tensor([1e-40, 1e-30, 1e30, 3e38, 7.5, 0.0, -8.0, float("inf")])
    for exponent in (1 / 3, 1 / 2.4, 5, -0.75, 2.5):
        fn = lambda x, e=exponent: x ** e  # noqa: E731
        assert torch.equal(ember.compile(fn)(x).nan_to_num(), fn(x).nan_to_num()), exponent


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_clamp_bounds_are_16_bit_values(dtype):
    # eager clamps float16 1.0 at 0.9999 rounded to float16 (1.0): 1 / (1 - 1) is inf; the
    # fused kernel clamped at 0.9999 and gave 10000
    x = torch.tensor([1.0, 0.5, -1.0, 0.99995], dtype=dtype, device=DEVICE)
    fn = lambda x: 1 / (1 - torch.clamp(x, min=-0.9999, max=0.9999))  # noqa: E731
    assert torch.equal(ember.compile(fn)(x), fn(x))


def test_any_and_all_over_no_dims_reduce_nothing():
    # ATen's any/all over dims () reduce over none (sum's () means all): ember reduced them all
    b, x = torch.rand(3, 4, device=DEVICE) > 0.5, torch.randn(3, 4, device=DEVICE)
    for fn in (lambda b: torch.any(b, ()), lambda b: torch.all(b, (), keepdim=True), lambda b: torch.all(b, [])):
        for a in (b, x):
            out, report = run(fn, a)
            assert not report.fallbacks and not [g.error for g in report.graphs if g.error]
            assert_same(out, fn(a))


_BOOL_SUMS = [  # (a row of 32 trues wrapped a byte accumulator to false; 40000 elements: the threads' path)
    ("rows", lambda x: x.sum(1, dtype=torch.bool), (2, 32), True),  # (True: under Triton too)
    ("whole", lambda x: x.sum(dtype=torch.bool), (40000,), True),
    ("columns", lambda x: x.sum(0, dtype=torch.bool), (300, 200), False),  # (interpreted: minutes)
    ("products", lambda x: (x.prod(dtype=torch.bool), x.prod(1, dtype=torch.bool)), (200, 200), False),
]


@pytest.mark.parametrize("name,fn,shape,target", [
    *(pytest.param(n, f, s, None, id=f"{n}-native") for n, f, s, _ in _BOOL_SUMS),
    *(pytest.param(n, f, s, "triton", id=f"{n}-triton", marks=on_the_interpreter) for n, f, s, t in _BOOL_SUMS if t)])
def test_sums_into_bool_are_any_element_nonzero(name, fn, shape, target):
    # a bool sum accumulated in a bool with +: OpenMP's partials added to invalid bool bytes
    # (wrong results, a crash on the threads' path); eager's is "any element nonzero"
    options = {"target": target} if target else None
    ones = torch.ones(shape, dtype=torch.int8, device=DEVICE)
    last = torch.zeros(shape, dtype=torch.int8, device=DEVICE)
    last.view(-1)[-1] = 3
    mixed = (torch.rand(shape, generator=torch.Generator().manual_seed(0)) > 0.995).to(torch.int8).to(DEVICE)
    for x in (ones, last, mixed, torch.zeros_like(ones)):
        check(fn, x, options=options)


def test_bool_sums_render_as_any_on_every_backend():
    x = torch.ones(2, 40000, dtype=torch.int8)
    for target, any_op, sum_op in (("cpp", "reduction(||:", "reduction(+:"), ("cuda", "EmberAnyOp", "EmberSumOp"),
                                   ("triton", "eh.logical_or", "eh.add")):
        for fn in (lambda x: x.sum(1, dtype=torch.bool), lambda x: x.sum(dtype=torch.bool)):
            (k,) = ember.explain(fn, x, target=target).kernels
            assert any_op in k.source and sum_op not in k.source, (target, k.source)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32])
def test_sums_of_one_negative_zero_are_positive_zero_as_eager(dtype):
    # eager's sums start from +0.0: the sum of a lone -0.0 (a 0-d tensor's, a scan's first
    # element) is 0.0; ember took the element itself. A product, and a 0-d tensor's cumsum, keep it
    zero = torch.tensor(-0.0, dtype=torch.float32, device=DEVICE).to(dtype)
    column = torch.full((2, 1), -0.0, device=DEVICE).to(dtype)
    cases = [(lambda x: x.sum(), zero), (lambda x: x.sum(0), zero), (lambda x: x.nansum(), zero),
             (lambda x: x.sum(dtype=torch.float64), zero), (lambda x: x.prod(), zero),
             (lambda x: x.cumsum(1), column), (lambda x: x.cumsum(0), zero.view(1)),
             (lambda x: x.cumsum(0), zero), (lambda x: x.cumprod(1), column)]
    if dtype.is_floating_point:
        cases += [(lambda x: x.mean(), zero), (lambda x: x.nanmean(), zero),
                  (lambda x: torch.logcumsumexp(x, 1), column), (lambda x: torch.logcumsumexp(x, 0), zero)]
    for i, (fn, x) in enumerate(cases):
        out, ref = run(fn, x)[0], fn(x)
        assert_same(out, ref)
        assert torch.equal(out.signbit(), ref.signbit()), (i, out, ref)


def test_float16_roots_by_pow_are_eagers():
    # eager's CPU pow takes no root for float16 (pow(-inf, 0.5) is inf, sqrt's nan; pow(-0, -0.5)
    # is inf, rsqrt's -inf); bool ** bool raises in eager
    x = torch.tensor([float("-inf"), -0.0, 4.0, 0.25, float("nan")], dtype=torch.float16, device=DEVICE)
    fn = lambda x: [x ** 0.5, x ** -0.5]  # noqa: E731
    for o, r in zip(ember.compile(fn)(x), fn(x)):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o[~o.isnan()], r[~r.isnan()])
    b = torch.tensor([True, False], device=DEVICE)
    with pytest.raises(NotImplementedError):
        ember.compile(lambda a, c: a ** c)(b, b)


def test_tanh_is_accurate_near_zero():
    # 1 - 2 / (exp(2x) + 1) cancels for small x: 4000 ulp at 4.6e-4 (within allclose's atol)
    x = torch.cat([torch.linspace(-1, 1, 20001, device=DEVICE), torch.tensor([4.5556e-4, -0.0], device=DEVICE)])
    out = ember.compile(torch.tanh)(x)
    exact = torch.tanh(x.double())
    assert ((out.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max() < 1e-6
    assert torch.equal(out.signbit(), x.signbit())


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
def test_scalars_beyond_a_dtype_are_what_eager_makes_them(target):
    # 1e40 is inf in float32 (the C literal was "inff": the kernel failed to build); an int
    # beyond an int8 wraps as eager wraps it (Triton's literal crashed)
    options = {"target": target} if target else None
    f, i8 = torch.ones(3, device=DEVICE), torch.tensor([44, 1, -128], dtype=torch.int8, device=DEVICE)
    fn = lambda f, i: [f * 1e40, f > 1e39, f - 1e39, i + 300, i == 300, i & 0x1ff]  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, _ = run(fn, f, i8, options=options)
    assert not [w for w in caught if "ember" in str(w.message)], [str(w.message) for w in caught]
    for o, r in zip(out, fn(f, i8)):
        assert torch.equal(o, r), (o, r)


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_16_bit_values_are_read_rounded_where_results_jump(dtype, target):
    # ember computes 16-bit math in float32; a comparison, a rounding, a conversion or an
    # argmax's ties read a computed value rounded as eager holds it ((x * 1000).int() gave 1703
    # where eager gives 1704, and a threshold flipped)
    if target == "triton" and dtype == torch.bfloat16:
        pytest.skip("Triton's interpreter truncates float32 to bfloat16 (GPUs round to nearest even)")
    x = torch.tensor([0.3, 1.7, -2.3, 123.4, 0.05, 2.2, 2.21], dtype=dtype, device=DEVICE)

    def fn(x):
        y = x * 1000
        return [y.int(), y > 300, (x + 1000.3).float(), torch.round(x * 37.3), (x * 3.3).floor(),
                (x * 3.3).argmax(), (x * 1e4).isinf(), (x * 7).to(torch.int8)]

    out, report = run(fn, x, options={"target": target} if target else None)
    assert not [g.error for g in report.graphs if g.error]
    for i, (o, r) in enumerate(zip(out, fn(x))):
        assert torch.equal(o, r), (i, o, r)


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
def test_variance_of_data_with_a_large_mean(target):
    # a first mean rounded to float32 (a float32 sum of 1e5 values near 1e5 is off by units)
    # was squared into the variance: relative errors of 2e-5 (C++) and 4.8 (Triton); the
    # deviations' sum now repairs it, and LayerNorm normalizes by the repaired mean
    x = torch.randn(4, 100000, generator=torch.Generator().manual_seed(0)) + 1e5
    fn = lambda x: [x.var(1), torch.var_mean(x, 1)[0], x.std(1)]  # noqa: E731
    out, report = run(fn, x, options={"target": target} if target else None)
    assert not [g.error for g in report.graphs if g.error]
    exact = x.double().var(1)
    worst = max(((o.double() - r) / r).abs().max().item() for o, r in zip(out, [exact, exact, exact.sqrt()]))
    assert worst < (1e-6 if target is None else 1e-4), worst
    ln = lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],))  # noqa: E731
    y = x[:, :4096].contiguous()
    exact = ln(y.double())
    got = run(ln, y, options={"target": target} if target else None)[0]
    assert (got.double() - exact).abs().max().item() <= 4 * (ln(y).double() - exact).abs().max().item() + 1e-5


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
def test_std_of_huge_and_tiny_values(target):
    # the variance of 1e20 is 1e40, past float32; eager's CPU kernel takes the root in double
    x = torch.tensor([[1e20, -1e20, 1e20, -1e20], [1e-25, -1e-25, 3e-25, 0.0]])
    fn = lambda x: [x.std(1), torch.std_mean(x, 1)[0], x.std(), x.std(1, correction=0)]  # noqa: E731
    out, report = run(fn, x, options={"target": target} if target else None)
    assert not [g.error for g in report.graphs if g.error]
    for o, r in zip(out, fn(x)):
        assert torch.isfinite(o).all()
        assert_same(o, r)


def test_var_and_std_without_degrees_of_freedom_warn_as_eager():
    # eager warns "var(): degrees of freedom is <= 0" from the sizes (its result is NaN or inf);
    # ember gave the NaN silently. The host program checks the sizes: symbolic ones each call
    fn = lambda x: [x.std(1, correction=2), torch.var(x, 0, correction=2), torch.var_mean(x, 1, correction=3)[0]]  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)

    def warned(f, x):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = f(x)
        return out, sorted(str(w.message).split("(")[0] for w in caught if w.category is UserWarning)

    for shape in ((3, 4), (3, 2), (2, 5)):  # (one compile: the sizes are symbolic)
        x = torch.randn(shape, device=DEVICE)
        (expected, eager_warnings), (got, ember_warnings) = warned(fn, x), warned(compiled, x)
        assert ember_warnings == eager_warnings, shape
        for o, r in zip(got, expected):
            assert_same(o, r)


def test_softmax_of_integers_raises_as_in_eager():
    x = torch.arange(6).view(2, 3)
    for fn in (lambda x: torch.softmax(x, -1), lambda x: torch.log_softmax(x, 1)):
        with pytest.raises(NotImplementedError):
            fn(x)
        with pytest.raises(NotImplementedError):
            ember.compile(fn)(x)


@pytest.mark.parametrize("target", [None, pytest.param("triton", marks=on_the_interpreter)], ids=["native", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vector_norms_fuse_with_what_reads_them(dtype, target):
    # the 2-norm and 1-norm are sums over the reduced dims: F.normalize is one kernel (the norm
    # ran through ATen before, and split it in two); other orders are sums of |x|^p (test_loss_edges.py)
    import torch.nn.functional as F

    x = torch.randn(7, 33, dtype=dtype, device=DEVICE)
    x[2] = 0
    options = {"target": target} if target else None
    out, report = run(lambda x: F.normalize(x, dim=-1), x, options=options)
    assert report.fallbacks == [] and len(report.kernels) == 1
    assert_same(out, F.normalize(x, dim=-1))
    fns = [lambda x: torch.linalg.vector_norm(x, 1, dim=(0, 1), keepdim=True), lambda x: x.norm(dim=0),
           lambda x: torch.linalg.vector_norm(x), lambda x: torch.linalg.vector_norm(x[:, :0], dim=1),
           lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1)]
    for fn in fns:
        out, report = run(fn, x, options=options)
        assert_same(out, fn(x))
    # and its gradient, as a cosine-similarity loss trains it
    def loss(a, b):
        return (1 - F.cosine_similarity(a, b, dim=-1)).mean()

    grads = []
    for f in (loss, ember.compile(loss, options=options)):
        a, b = x.float().clone().requires_grad_(), x.float().flip(0).clone().requires_grad_()
        f(a, b).backward()
        grads.append((a.grad, b.grad))
    assert_same(grads[1], grads[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_tensors_made_in_the_graph_hold_16_bit_values(dtype):
    # full/full_like/scalar_tensor of 0.1001 kept the float32 literal: it compared above a
    # bfloat16 0.1001, and .long() of 257 gave 257 (bfloat16 holds 256)
    a = torch.zeros(2, dtype=dtype, device=DEVICE)
    for fn in (lambda a: torch.full_like(a, 0.1001) > 0.1001,
               lambda a: torch.full((2,), 257, dtype=dtype, device=a.device).long(),
               lambda a: torch.full_like(a, 1 / 3).float(),
               lambda a: a.new_full((3,), 1e-8).float() * 1e8,
               lambda a: (a + 0.333) >= torch.full((), 0.333, device=a.device).to(dtype),
               lambda a: (a - 0.4921875 + torch.full((), 1 / 3, device=a.device)).float()):
        assert_same(ember.compile(fn)(a), fn(a))


@pytest.mark.parametrize("shifts, dims", [(3, 2), ((1, -4), (0, 3)), (12, -1), ((2, 2), (1, 1))])
@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
def test_roll_is_a_cat_of_slices_that_fuses(shifts, dims, layout):
    x = torch.randn(2, 5, 7, 9, device=DEVICE)
    x = {"contiguous": x, "channels_last": x.to(memory_format=torch.channels_last),
         "transposed": x.transpose(1, 3)}[layout]
    report = check(lambda x: torch.roll(x, shifts, dims) * 2 + 1, x)
    assert len(report.kernels) == 1 and report.fallbacks == []


def test_roll_corners():
    check(lambda x: torch.roll(x, 2, 0) + 1, torch.zeros(0, 3, device=DEVICE))
    check(lambda x: torch.roll(x, 1, 0), torch.tensor([True, False, True], device=DEVICE))
    check(lambda x: torch.roll(x, (1,)) * 2, torch.arange(6, device=DEVICE).view(2, 3))  # (flattened: ATen)
    for n in (5, 8, 9):
        check(lambda x: x.roll(2, 1) - x, torch.randn(3, n, device=DEVICE), dynamic=True)
    # along symbolic sizes, by a symbolic shift too: one graph of one kernel (they went to ATen)
    rolled = lambda x, k: torch.roll(x, (k, -1), (0, 1)).sin()  # noqa: E731
    compiled, report = compile_checked(rolled, dynamic=True)
    for n, k in ((5, 2), (8, -3), (9, 9), (3, 7)):
        x = torch.randn(n, n + 1, device=DEVICE)
        assert_same(compiled(x, k), rolled(x, k))
    assert_clean(report)
    assert len(report.graphs) == 1 and len(report.kernels) == 1 and report.fallbacks == []
    x = torch.randn(4, 6, device=DEVICE, requires_grad=True)
    compiled = ember.compile(lambda x: (torch.roll(x, 5, 1) * torch.arange(6.0, device=DEVICE)).sum())
    compiled(x).backward()
    expected = torch.roll(torch.arange(6.0, device=DEVICE).expand(4, 6), -5, 1)
    assert_same(x.grad, expected)


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 300), (torch.float16, 2060)])
def test_16_bit_aranges_hold_16_bit_values(dtype, n):
    # an arange computed in a kernel was its exact index (bfloat16 257 where eager holds 256):
    # cos(257) for cos(256), errors of order 1
    one = torch.ones((), dtype=dtype, device=DEVICE)
    for fn in (lambda s: torch.arange(n, dtype=dtype, device=DEVICE).cos() * s,
               lambda s: torch.arange(1.5, n, 2.5, dtype=dtype, device=DEVICE) / 3 * s):
        assert torch.equal(ember.compile(fn)(one), fn(one))


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU backend's conversions (eager's GPU casts differ)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_float_to_integer_casts_of_nan_and_out_of_range_values_are_eagers(dtype):
    # C++ leaves these undefined, and GCC folded (float)(int8_t)x into truncf(x): NaN stayed NaN,
    # 300.7 came back 300 where eager's int8 is 44, -1 as uint8 came back -1
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 300.7, -1.0, -129.5, 3e9, -3e9, 1e20, -2.5,
                      65535.9, 70000.0, 2147483648.0], dtype=torch.float32).to(dtype).repeat(70)
    for to in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        for fn in (lambda x, to=to: x.to(to).float(), lambda x, to=to: x.to(to) * 0.5,
                   lambda x, to=to: (x * 1).to(to)):
            out = ember.compile(fn)(x)
            assert out.dtype == fn(x).dtype and torch.equal(out, fn(x)), (to, out[:13], fn(x)[:13])


def test_shift_operators_are_generated():
    # x << n and x >> n are aten.__lshift__ / __rshift__, not the bitwise_*_shift ops: they ran
    # through ATen
    x = torch.tensor([-128, -3, 0, 5, 127], dtype=torch.int8, device=DEVICE)
    counts = torch.tensor([0, 1, 7, 8, 9], dtype=torch.int8, device=DEVICE)
    for fn, args in [(lambda x: (x << 3) + (x >> 1), (x,)), (lambda x, s: (x << s, x >> s), (x, counts)),
                     (lambda x: (x.long() << 63, x.long() >> 70, 3 << x.abs()), (x,))]:
        report = check(fn, *args)
        assert report.fallbacks == [], report.fallbacks


def test_arange_bounds():
    # of bools: eager's NotImplementedError (ember made 0, 1, 1, ...); symbolic start and step
    # (a flip's arange(n - 1, -1, -1)) are generated, not run through ATen
    with pytest.raises(NotImplementedError):
        ember.compile(lambda x: torch.arange(x.shape[0], dtype=torch.bool, device=DEVICE))(torch.zeros(3))
    report = ember.Report()
    fn = ember.compile(lambda x: x[torch.arange(x.shape[0] - 1, -1, -1, device=DEVICE)] * 2
                       + torch.arange(x.shape[0], 3 * x.shape[0], 2, dtype=torch.int8, device=DEVICE),
                       dynamic=True, report=report)
    for n in (5, 90):
        x = torch.arange(n, device=DEVICE)
        expected = x.flip(0) * 2 + torch.arange(n, 3 * n, 2, dtype=torch.int8, device=DEVICE)
        assert_same(fn(x), expected)
    assert report.fallbacks == [] and len(report.graphs) == 1, report.summary()


def test_int64_arange_whose_aten_count_overflows_raises_eagers_error():
    # a range wider than 2**63: ATen's int64 count wraps and eager raises; the traced length is
    # exact, and ember returned 4 or 2 values. (One function each: a recompile of one would
    # make the bounds symbolic)
    for fn in (lambda x: torch.arange(-2**62, 2**62, 2**61 + 1, device=DEVICE) + x,
               lambda x: torch.arange(0, 2**63 - 1, 2**62, device=DEVICE) + x):
        with pytest.raises(RuntimeError, match="possible overflow"):
            fn(torch.ones((), dtype=torch.int64, device=DEVICE))
        with pytest.raises(RuntimeError, match="possible overflow"):
            ember.compile(fn)(torch.ones((), dtype=torch.int64, device=DEVICE))
    check(lambda x: torch.arange(2**63 - 10, 2**63 - 1, 3, device=DEVICE) + x, torch.ones((), dtype=torch.int64))
    # symbolic bounds: the host program checks the count, where the C loop bound wrapped (two
    # unwritten elements came back)
    fn = ember.compile(lambda x, n, step: torch.arange(0, n, step, device=DEVICE) + x, dynamic=True)
    x = torch.ones((), dtype=torch.int64, device=DEVICE)
    assert_same(fn(x, 10, 3), torch.arange(0, 10, 3, device=DEVICE) + x)
    with pytest.raises(RuntimeError, match="arange: invalid size, possible overflow"):
        fn(x, 2**63 - 1, 2**62)
    assert_same(fn(x, 2**62, 2**61), torch.arange(0, 2**62, 2**61, device=DEVICE) + x)


def test_16_bit_where_with_numbers_past_their_range():
    # where(mask, x, -1e9) makes a scalar_tensor, which eager's CPU kernel rounds into float16
    # unchecked (-inf; 65519 is 65504): it ran through ATen. Eager's CUDA kernel refuses it
    x = torch.tensor([0.5, -2.0, 3.0], device=DEVICE)
    for fn in (lambda x: (torch.where(x > 0, x, -1e9) * 2, torch.where(x > 0, x, 65519.0)),
               lambda x: torch.where(x > 0, x, 1e39)):
        for arg in (x.half(), x.bfloat16()):
            try:
                fn(arg)
            except RuntimeError:  # (CUDA: -1e9 past float16's range, 1e39 past both)
                assert DEVICE != "cpu"
                with pytest.raises(RuntimeError, match="without overflow"):
                    ember.compile(fn)(arg)
                continue
            report = check(fn, arg)
            assert DEVICE != "cpu" or report.fallbacks == [], report.fallbacks


def test_max_over_nonempty_dims_of_an_empty_tensor():
    # only a reduced dim of size 0 makes eager raise: amax over the columns of a (0, 3) tensor
    # is empty, and ran through ATen
    report = check(lambda x: (x.amax(1), x.amin((1, 2)) + 1), torch.zeros(0, 3, 2, dtype=torch.int32, device=DEVICE))
    assert report.fallbacks == [], report.fallbacks
