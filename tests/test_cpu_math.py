"""The CPU backend's float32 exp2, log, log2, log10, sinh, cosh, atan, atan2, asin, acos, pow,
sin, cos and tan, and its float64 exp, expm1, tanh, log and log1p (codegen/cpp_math.py; glibc's
have no vector forms GCC uses, and loops calling them ran one element at a time): within their
ulp bounds over every exponent (float64's: samples against mpmath), exact at their ends, and the
ops and losses built on them (xlogy, KL divergence, log-softmax, NLL, sums of sines and cosines)
against eager over dtypes, awkward shapes, symbolic sizes and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.codegen.cpp_math import _two_over_pi_bits

from .conftest import DEVICE
from .helpers import assert_clean, assert_gradients_match, assert_same, every_exponent, run, ulps

needs_cpu = pytest.mark.skipif(DEVICE != "cpu", reason="the C++ backend's float32 math")

# tools/check_cpu_math.py's maxima over all 2^32 inputs (atan2: 2^32 pairs), rounded up (pow's is
# 0.500, its own test's bound)
LIMITS = {"exp2": 0.9, "log": 0.9, "log2": 0.9, "log10": 0.9, "sinh": 1.65, "cosh": 1.5, "atan": 1.4,
          "atan2": 1.5, "asin": 1.25, "acos": 0.8, "sin": 0.51, "cos": 0.51, "tan": 0.51}
# the inputs where each is defined, finite and not an end (the ends have their own test)
DOMAINS = {"exp2": (-160.0, 130.0), "log": (1e-45, 3.5e38), "log2": (1e-45, 3.5e38), "log10": (1e-45, 3.5e38),
           "sinh": (-89.4, 89.4), "cosh": (-89.4, 89.4), "atan": (-3.5e38, 3.5e38),
           "asin": (-1.0, 1.0), "acos": (-1.0, 1.0), "sin": (-3.5e38, 3.5e38), "cos": (-3.5e38, 3.5e38),
           "tan": (-3.5e38, 3.5e38)}


def _assert_same_bits(out: torch.Tensor, ref: torch.Tensor, *inputs: torch.Tensor) -> None:
    """The same values and signs (NaN for NaN); the inputs where they differ in the message."""
    same = (out == ref) & (out.signbit() == ref.signbit()) | out.isnan() & ref.isnan()
    assert same.all(), list(zip(*(t[~same].tolist() for t in (*inputs, out, ref))))


def _assert_every_pair_exact(fn, vals: list[float]) -> None:
    """fn of every pair of ``vals`` is the float32 nearest fn's double, sign and NaN included."""
    a = torch.tensor([u for u in vals for _ in vals])
    b = torch.tensor([v for _ in vals for v in vals])
    out, report = run(fn, a, b)
    assert_clean(report)
    _assert_same_bits(out, fn(a.double(), b.double()).float(), a, b)


def _source(report: ember.Report) -> str:
    return "\n".join(k.source for k in report.kernels)


@needs_cpu
@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_within_their_ulps_over_every_exponent(name):
    fn = getattr(torch, name)
    x = every_exponent(*DOMAINS[name])
    out, report = run(fn, x)
    assert_clean(report)
    assert f"ember_{name}(" in _source(report) and f"std::{name}" not in _source(report), _source(report)
    exact = fn(x.double())
    finite = exact.float().isfinite() & (exact != 0)
    err = ulps(out[finite], exact[finite])
    assert err.max() <= LIMITS[name], (err.max(), x[finite][err.argmax()])


@needs_cpu
def test_atan2_within_its_ulps_over_every_pair_of_exponents():
    y = every_exponent(-3.5e38, 3.5e38, seed=1)
    x = every_exponent(-3.5e38, 3.5e38, seed=2)
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(3))]
    n = min(x.numel(), y.numel())
    y, x = y[:n], x[:n]
    out, report = run(torch.atan2, y, x)
    assert_clean(report)
    assert "ember_atan2(" in _source(report), _source(report)
    exact = torch.atan2(y.double(), x.double())
    finite = exact.float() != 0
    err = ulps(out[finite], exact[finite])
    assert err.max() <= LIMITS["atan2"], (err.max(), y[finite][err.argmax()], x[finite][err.argmax()])


INF, NAN = float("inf"), float("nan")
ENDS = [NAN, -NAN, INF, -INF, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754942e-38, 1.1754944e-38,
        1e-30, -1e-30, 2.0 ** -25, 0.5, -0.5, 0.50000006, 0.49999997, 1.0, -1.0, 0.99999994, -0.99999994,
        1.0000001, -1.0000001, 2.0, 2.0000002, 1.9999999, 88.72283, 88.7229, 89.0, 89.41598, 89.416, 90.0,
        100.0, -100.0, 127.99999, 128.0, -126.0, -126.5, -149.0, -149.5, -150.0, -150.5, 16777216.0,
        3.4028235e38, -3.4028235e38]


@needs_cpu
@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_at_their_ends(name):
    fn = getattr(torch, name)
    x = torch.tensor(ENDS)
    out, report = run(fn, x)
    assert_clean(report)
    exact = fn(x.double())
    for xi, got, want, e in zip(ENDS, out.tolist(), exact.float().tolist(), exact.tolist()):
        if math.isnan(want):
            assert math.isnan(got), (name, xi, got)
        elif math.isinf(want) or want == 0 or math.isinf(xi):
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (name, xi, got, want)
        else:
            ulp = 2.0 ** (math.floor(math.log2(max(abs(want), 2.0 ** -126))) - 23)
            assert abs(got - e) <= LIMITS[name] * ulp, (name, xi, got, e)


@needs_cpu
def test_atan2_at_its_ends():
    """Signed zeros and infinities in every combination, and NaN in either place: C's atan2 rules
    (atan2(-0, -0) is -pi, atan2(inf, -inf) 3 pi/4), each multiple of pi/4 the float32 nearest it
    (eager's is 1 ulp below it at atan2(1, 1) and atan2(3e38, -1e-45))."""
    _assert_every_pair_exact(torch.atan2, [0.0, -0.0, 1.0, -1.0, 1e-45, -1e-45, INF, -INF, NAN, 3e38, -3e38])


def _kl(x, t):
    return F.kl_div(x, t, reduction="batchmean")


OPS = {
    "exp2": torch.exp2, "log": torch.log, "log2": torch.log2, "log10": torch.log10, "sinh": torch.sinh,
    "cosh": torch.cosh, "atan": torch.atan, "asin": torch.asin, "acos": torch.acos,
    "atan2": lambda x: torch.atan2(x, x.flip(-1) - 0.5),
    "xlogy": lambda x: torch.xlogy(x, x.abs() + 0.25),
    "log_softmax": lambda x: F.log_softmax(x, -1),
    "logit": lambda x: torch.logit(torch.sigmoid(x)),
    "angle_sum": lambda x: torch.atan2(x.sin(), x.cos()).sum(-1),
    # pows (ember_pow_narrow): of a scalar (eager's in double), of two tensors, in a norm
    "pow_scalar": lambda x: x.abs() ** 2.5,
    "pow_signed_scalar": lambda x: x ** 3.0 + x ** -1.5,
    "pow_tensor": lambda x: torch.pow(x.abs(), x.flip(-1)),
    "pow_norm": lambda x: torch.linalg.vector_norm(x, 3.0, dim=-1),
    "pow_scalar_base": lambda x: torch.pow(1.7, x),
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan,
    "sin_cos_terms": lambda x: torch.cat([x * x.flip(-1).cos() - x.flip(0).sin(), x.sin() * 1e3 + x.cos()], -1),
}


@needs_cpu
@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_ops_match_eager(name, dtype):
    fn = OPS[name]
    torch.manual_seed(0)
    x = (torch.randn(37, 65) * 3).to(dtype)
    x[0, :7] = torch.tensor([0.0, -0.0, INF, -INF, NAN, 1e-30, 0.75])
    out, report = run(fn, x)
    assert_clean(report)
    assert_same(out, fn(x))


@needs_cpu
@pytest.mark.parametrize("shape", [(0,), (1,), (0, 5), (5, 1, 3)], ids=str)
def test_ops_over_awkward_shapes(shape):
    x = torch.rand(shape) * 0.9
    x_t = torch.rand(tuple(reversed(shape))).permute(*reversed(range(len(shape)))) * 0.9
    for inp in (x, x_t):
        for name in ("log", "asin", "sinh", "atan2", "sin", "tan"):
            out, _ = run(OPS[name], inp)
            assert_same(out, OPS[name](inp))


@needs_cpu
def test_atan2_broadcasts_and_takes_a_scalar():
    y, x = torch.randn(4, 1, 5), torch.randn(3, 1)
    out, _ = run(torch.atan2, y, x)
    assert_same(out, torch.atan2(y, x))
    fn = lambda y: torch.atan2(y, torch.tensor(-2.0))  # noqa: E731
    out, _ = run(fn, y)
    assert_same(out, fn(y))


@needs_cpu
def test_symbolic_sizes_match_eager():
    fn = lambda x: torch.log(x.abs()) + torch.atan2(x, x + 1) + torch.cosh(x)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for n in (5, 33, 1, 0, 1000):
        x = torch.randn(n) * 5
        assert_same(compiled(x), fn(x))


@needs_cpu
@pytest.mark.parametrize("name", ["exp2", "log", "log2", "log10", "sinh", "cosh", "atan", "asin", "acos", "atan2",
                                  "sin", "cos", "tan"])
def test_gradients_match_eager(name):
    fn = OPS[name]
    torch.manual_seed(1)
    wrapped = (lambda v: fn(v.abs() + 0.05)) if name.startswith("log") else fn
    assert_gradients_match(wrapped, torch.rand(64, 33) * 1.8 - 0.9)


@needs_cpu
def test_kl_divergence_and_nll_with_their_gradients_match_eager():
    torch.manual_seed(2)
    logits = (torch.randn(128, 40) * 4).requires_grad_()
    target = torch.softmax(torch.randn(128, 40), -1)
    target[0, :3] = 0.0  # (xlogy's 0 log 0 = 0)
    labels = torch.randint(0, 40, (128,))

    def loss(z, t, y):
        logp = F.log_softmax(z, -1)
        return _kl(logp, t) + F.nll_loss(logp, y)

    ref_logits = logits.detach().clone().requires_grad_()
    out = ember.compile(loss)(logits, target, labels)
    ref = loss(ref_logits, target, labels)
    out.backward()
    ref.backward()
    assert_same(out, ref)
    assert_same(logits.grad, ref_logits.grad)


def test_two_over_pis_bits_are_mpmaths():
    """sin's, cos's and tan's reduction cuts its parts from 2/pi's first 256 bits (Machin's
    formula in integers): every one of them right."""
    import mpmath  # (torch's sympy needs it)

    with mpmath.workprec(400):
        assert _two_over_pi_bits(256) == int(mpmath.floor(mpmath.mpf(2) ** 257 / mpmath.pi))


@needs_cpu
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_near_multiples_of_half_pi(name):
    """The range reduction's hard inputs: the floats nearest k pi/2 (and their neighbours), where
    |x| (2/pi) cancels to a tiny remainder, for small k and for k up to 2^100; and 2^k, whose
    reduction takes 2/pi's bits from every place."""
    k = torch.cat([torch.arange(1, 4000, dtype=torch.float64),
                   torch.tensor([2.0 ** j * m for j in range(20, 101, 4) for m in (1, 3, 5, 7, 0.999)],
                                dtype=torch.float64)])
    near = (k * (math.pi / 2)).float()
    bits = near.view(torch.int32)
    x = torch.cat([near, (bits + 1).view(torch.float32), (bits - 1).view(torch.float32),
                   2.0 ** torch.arange(-149, 128, dtype=torch.float64).float()])
    x = torch.cat([x, -x])
    out, report = run(getattr(torch, name), x)
    assert_clean(report)
    assert f"ember_{name}(" in _source(report), _source(report)
    exact = torch.tensor([getattr(math, name)(v) for v in x.double().tolist()], dtype=torch.float64)
    err = ulps(out, exact)
    assert err.max() <= LIMITS[name], (err.max(), x[err.argmax()].item())


@needs_cpu
@pytest.mark.parametrize("name", ["sin", "cos", "tan"])
def test_near_forms_give_the_full_forms_bits(name):
    """A loop whose arguments are all below 2^26 takes ember_<name>_near (2/pi's first bits as
    constants), else the full reduction, a block of 4096 elements at a time: the same bits for
    the same argument either way. Block 2 of y holds one huge argument (the full form there), x
    none (the near form)."""
    fn = getattr(torch, name)
    torch.manual_seed(4)
    x = torch.cat([torch.randn(3 * 4096) * 10, torch.rand(4096) * 2.0 ** 25])
    y = x.clone()
    y[2 * 4096 + 7] = 3e37
    out_x, report = run(fn, x)
    out_y, _ = run(fn, y)
    source = _source(report)
    assert f"ember_{name}_near(" in source and f"ember_{name}(" in source, source
    same = torch.ones_like(x, dtype=torch.bool)
    same[2 * 4096 + 7] = False
    assert torch.equal(out_x[same], out_y[same])
    assert_same(out_x, fn(x))
    exact = torch.tensor([getattr(math, name)(v) for v in y.double().tolist()], dtype=torch.float64)
    assert ulps(out_y, exact).max() <= LIMITS[name]


@needs_cpu
def test_near_forms_over_rows_and_awkward_arguments():
    """The check before each row's loop (2-d), with NaN, inf and -0 in some rows, in bfloat16 and
    float16 too, and a cos of a sin (the check computes the inner one)."""
    # (no arithmetic before the outer functions: eager rounds a 16-bit x * 3, ember does not)
    fn = lambda x: torch.sin(x[:, 1:]) + torch.cos(torch.sin(x[:, :-1])) * torch.tan(x[:, 1:])  # noqa: E731
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(40, 33) * 100).to(dtype)
        x[3, 4], x[5, 0], x[7, 9], x[9, 2] = INF, NAN, -0.0, 6e4
        out, report = run(fn, x)
        # (float16 rows convert a strip at a time, cpp_staging.py: those loops keep the full forms)
        assert ("ember_sin_near(" in _source(report)) == (dtype != torch.float16)
        assert_same(out, fn(x))


# pow: float32 pows (and eager's float32 x ** scalar, computed in double) through ember_pow_narrow
@needs_cpu
@pytest.mark.parametrize("exponent", [2.5, 1 / 3, -1.7, 0.1, 7.0, 13.0, -3.0, 1e-3, 40.5])
def test_pow_of_a_scalar_is_float32s_rounding_of_the_exact_power(exponent):
    x = every_exponent(-3.5e38, 3.5e38)
    fn = lambda v: v ** exponent  # noqa: E731
    out, report = run(fn, x)
    assert_clean(report)
    assert "ember_pow_narrow(" in _source(report) and "std::pow" not in _source(report), _source(report)
    exact = x.double() ** exponent
    ends = exact.isnan() | (exact.float() == 0) | exact.float().isinf()
    assert out[exact.isnan()].isnan().all()
    same = out[ends & ~exact.isnan()] == exact[ends & ~exact.isnan()].float()
    assert same.all()
    err = ulps(out[~ends], exact[~ends])
    assert err.max() <= 0.5001, (err.max(), x[~ends][err.argmax()])


POW_ENDS = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 2.5, -2.5, INF, -INF, NAN, 1e-45, -1e-45,
            9007199254740992.0, -9007199254740992.0, 3e38, -3e38]


@needs_cpu
def test_pow_at_its_ends():
    """Every pair of signed zeros, ones, infinities, NaN, odd and even integers, non-integers and
    huge and tiny values: C's rules (0 ** -3 is inf, -0 ** -3 -inf, -1 ** inf 1, NaN ** 0 1, a
    negative base to a non-integer power NaN), as the float32 nearest the exact power."""
    _assert_every_pair_exact(torch.pow, POW_ENDS)


@needs_cpu
def test_a_double_pow_kept_in_double_keeps_libm():
    """The narrowed pow is less exact than a double: a pow whose double result is stored stays
    std::pow."""
    fn = lambda x: (x.double() ** 2.5, (x.double() ** 2.5).float())  # noqa: E731
    x = torch.rand(1000) * 10
    out, report = run(fn, x)
    assert "std::pow(" in _source(report), _source(report)
    libm = torch.tensor([math.pow(v, 2.5) for v in x.double().tolist()], dtype=torch.float64)
    assert torch.equal(out[0], libm)  # (the narrowed pow is 1e-13 off, hundreds of double ulps)
    assert_same(out, fn(x))


@needs_cpu
def test_pow_gradients_and_symbolic_sizes_match_eager():
    fn = lambda x, y: (x.abs() + 0.1) ** 2.5 + torch.pow(x.abs() + 0.5, y)  # noqa: E731
    compiled = ember.compile(fn, dynamic=True)
    for n in (5, 33, 1, 0, 300):
        x, y = torch.randn(n, requires_grad=True), torch.randn(n, requires_grad=True)
        rx, ry = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        out, ref = compiled(x, y), fn(rx, ry)
        assert_same(out, ref)
        out.sum().backward()
        ref.sum().backward()
        assert_same((x.grad, y.grad), (rx.grad, ry.grad))


def _f64_samples(name: str) -> torch.Tensor:
    """Samples of each float64 function's domain: its whole range, [-1, 1] and tiny arguments
    (exp: subnormal and near-1 results; log: exp's results, [0.5, 2], around 1, subnormals;
    log1p: also just above -1)."""
    g = torch.Generator().manual_seed(0)
    uniform = lambda n, lo, hi: torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo  # noqa: E731
    if name == "exp":
        return torch.cat([uniform(3000, -745.2, 709.78), uniform(3000, -1.0, 1.0), uniform(500, -1e-8, 1e-8)])
    if name == "log1p":
        return torch.cat([uniform(2000, -1.0, 1.0), uniform(2000, -1.0, 1e6), uniform(500, -1e-5, 1e-5),
                          uniform(300, -1e-15, 1e-15), uniform(500, -1.0, -0.999999)])
    if name in ("expm1", "tanh"):
        return torch.cat([uniform(2000, -45.0, 709.7) if name == "expm1" else uniform(2000, -25.0, 25.0),
                          uniform(2000, -1.0, 1.0), uniform(500, -1e-5, 1e-5), uniform(300, -1e-15, 1e-15)])
    return torch.cat([uniform(3000, -740.0, 709.0).exp(), uniform(2000, 0.5, 2.0), 1 + uniform(500, -1e-6, 1e-6),
                      uniform(300, 0.0, 1e-310)])


# (zeros, infinities, NaN, the tiniest arguments; exp and expm1: the largest finite result and
# the first infinite one, exp's smallest subnormal and first zero, expm1's -1; log and log1p: their
# poles, negatives, the smallest subnormal and normal, 1, the largest; tanh: where it rounds to 1)
F64_ENDS = {"exp": [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-300, -1e-300, 709.782712893384, 709.7827128933841,
                    710.0, 1e308, -708.3964185322641, -708.4, -720.0, -740.0, -745.1332191019411, -745.2, -1e308],
            "log": [0.0, -0.0, math.inf, -math.inf, math.nan, -1.0, -1e-320, 5e-324, 2.2250738585072014e-308, 1.0,
                    2.0, 0.5, 1.7976931348623157e308],
            "expm1": [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -1e-300, 709.782712893384, 710.0, -37.0, -40.0,
                      -800.0],
            "tanh": [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -1e-300, 19.0, 20.0, -25.0, 1e300],
            "log1p": [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, -1e-300, -1.0, -1.5, 1e300, -0.9999999999999999,
                      1.7976931348623157e308]}
F64_LIMITS = {"exp": 0.65, "log": 0.85, "expm1": 1.5, "tanh": 2.2, "log1p": 1.0}


def _glibc(name: str, v: float) -> float:
    try:
        return getattr(math, name)(v)
    except OverflowError:
        return math.inf
    except ValueError:  # (log of 0 or a negative, log1p of -1 or below)
        return -math.inf if v == {"log": 0.0, "log1p": -1.0}[name] else math.nan


@needs_cpu
@pytest.mark.parametrize("name", ["exp", "log", "expm1", "tanh", "log1p"])
def test_float64_functions_within_their_ulps_against_mpmath_and_exact_at_their_ends(name):
    """float64 exp, log, expm1, tanh and log1p without libm (ember_exp_f64 and the rest): within
    F64_LIMITS ulps of mpmath at 120 bits over samples of their domains (a subnormal result of
    exp, rounded twice, within 1 of their spacing), and glibc's bits at their ends."""
    import mpmath

    x = torch.cat([_f64_samples(name), torch.tensor(F64_ENDS[name], dtype=torch.float64)])
    out, report = run(getattr(torch, name), x)
    assert f"ember_{name}_f64(" in _source(report), _source(report)
    worst = {True: 0.0, False: 0.0}  # normal results, subnormal ones
    n = len(F64_ENDS[name])
    with mpmath.workprec(120):
        for v, o in zip(x[:-n].tolist(), out.tolist()):
            exact = getattr(mpmath, name)(mpmath.mpf(v))
            normal = abs(float(exact)) >= 2.0 ** -1022 or exact == 0
            if exact == 0:
                assert o == 0, (v, o)
                continue
            worst[normal] = max(worst[normal], float(abs(mpmath.mpf(o) - exact)) / math.ulp(float(exact)))
    assert worst[True] < F64_LIMITS[name] and worst[False] <= 1.0, worst
    ends, glibc = out[-n:], torch.tensor([_glibc(name, v) for v in F64_ENDS[name]], dtype=torch.float64)
    assert torch.equal(ends.isnan(), glibc.isnan()) and torch.equal(ends.nan_to_num(), glibc.nan_to_num()), ends


@needs_cpu
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 5), (3, 1000)], ids=str)
def test_float64_math_in_fused_ops_and_gradients_match_eager(shape):
    """Ops over float64 exp, expm1, tanh, log and log1p (softmax, log-softmax, sigmoids, SiLU, ELU,
    tanh's GELU, softplus, log of a sum) over awkward shapes and symbolic sizes, with their
    gradients, as eager's to float64's tolerance."""
    fn = lambda x: (torch.softmax(x, -1), 1 / (1 + torch.exp(-x)), F.elu(x), torch.exp(x).sum(-1),  # noqa: E731
                    F.log_softmax(x, -1), torch.log(x.abs() + 1e-3).sum(-1), torch.tanh(x) * 2, F.silu(x),
                    torch.sigmoid(x), F.gelu(x, approximate="tanh"), F.softplus(x), torch.log1p(x.abs()))
    x = torch.randn(shape, dtype=torch.float64) * 5
    out = ember.compile(fn, dynamic=True)(x)
    assert_same(out, fn(x))
    if x.numel():
        assert_gradients_match(lambda t: fn(t)[0] * 3 + fn(t)[2] + fn(t)[4] + fn(t)[6] + fn(t)[9], x)
