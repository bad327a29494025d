"""Triton helper functions that ember's generated kernels call as ``eh.<name>``.

On a GPU the math comes from libdevice (CUDA's own, correctly rounded where CUDA's is). Under
``TRITON_INTERPRET=1`` (how the CPU test suite runs Triton kernels) libdevice calls are not
available, so the same functions are written with ``tl`` primitives there; they are accurate to a
few float32 ulps, enough for the tests, and never used on a GPU.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# (kernels call these as eh.<name> too)
from .triton_bits import copysign, gcd, hypot, iabs, lcm, nextafter, signbit, wrap_i16  # noqa: E402, F401

# ---- reductions' combine functions ----------------------------------------------------------


@triton.jit
def add(a, b):
    return a + b


@triton.jit
def mul(a, b):
    return a * b


@triton.jit
def logical_or(a, b):
    return a | b


@triton.jit
def logical_and(a, b):
    return a & b


@triton.jit
def maximum(a, b):
    # torch.maximum: NaN wins. One max.NaN instruction: a compare-and-select chain is three
    # dependent instructions, and a row reduction's running max is a chain as long as the row
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def minimum(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def imaximum(a, b):
    return tl.maximum(a, b)


@triton.jit
def iminimum(a, b):
    return tl.minimum(a, b)


@triton.jit
def argmax_combine(v1, i1, v2, i2):
    # NaN counts as the largest value; ties (and NaN against NaN) keep the first index
    nan1 = v1 != v1
    nan2 = v2 != v2
    take = (v2 > v1) | (nan2 & ~nan1) | (((v2 == v1) | (nan1 & nan2)) & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


@triton.jit
def argmin_combine(v1, i1, v2, i2):
    nan1 = v1 != v1
    nan2 = v2 != v2
    take = (v2 < v1) | (nan2 & ~nan1) | (((v2 == v1) | (nan1 & nan2)) & (i2 < i1))
    return tl.where(take, v2, v1), tl.where(take, i2, i1)


# ---- masks ----------------------------------------------------------------------------------


@triton.jit
def below(index, bound: tl.constexpr, block: tl.constexpr):
    # index < bound, for a static bound: all true where blocks of ``block`` tile it exactly,
    # which Triton folds away, so the loads and stores of such kernels carry no predicate to
    # compute per element (H100, bf16, kernel us: a sum over dim 1 of (64, 2048, 768) 71.6 ->
    # 68.7, a softmax over rows of 999 98.2 -> 94.0). Grids launch cdiv(bound, block) blocks,
    # and one where the bound is 0 (a mean over no rows still stores its result): all false
    if bound > 0 and bound % block == 0:
        mask = tl.full(index.shape, 1, tl.int1)
    else:
        mask = index < bound
    return mask


# ---- integer arithmetic with Python's rounding (Triton's // and % truncate, like C) ----------


@triton.jit
def floordiv_int(a, b):
    q = a // b
    r = a - q * b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def truncdiv_int(a, b):
    return a // b


@triton.jit
def mod_int(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def fmod_int(a, b):
    return a % b


@triton.jit
def ipow(base, exp):
    # both broadcast to the result's shape first: the loop carries one type (a scalar base,
    # torch.pow(2, t), had the shape [1] there and failed to compile)
    b = base + tl.zeros_like(exp)
    e = exp + tl.zeros_like(base)
    result = tl.full(b.shape, 1, b.dtype)
    for _ in range(64):
        result = tl.where((e & 1) != 0, result * b, result)
        b = b * b
        e = e >> 1
    return tl.where(exp < 0, tl.where(base == 1, 1, tl.where(base == -1, tl.where((exp & 1) != 0, -1, 1), 0)),
                    result)


@triton.jit
def shl(a, b):
    bits = a.dtype.primitive_bitwidth
    return tl.where((b < 0) | (b >= bits), 0, a << b)


@triton.jit
def shr(a, b):
    bits = a.dtype.primitive_bitwidth
    return tl.where((b < 0) | (b >= bits), tl.where(a < 0, -1, 0), a >> b)


# ---- float math -----------------------------------------------------------------------------

if INTERPRET:
    @triton.jit
    def trunc(x):
        # (a product by -1, not a unary minus, which is 0 - x: trunc(-0.5) is -0.0)
        return tl.where(x < 0, tl.floor(-x) * -1.0, tl.floor(x))

    @triton.jit
    def rint(x):
        # round half to even
        f = tl.floor(x)
        d = x - f
        even = (f - 2.0 * tl.floor(f * 0.5)) == 0
        up = (d > 0.5) | ((d == 0.5) & ~even)
        r = tl.where(up, f + 1.0, f)
        return tl.where(x != x, x, tl.where(r == 0, x * 0.0, r))  # (a zero keeps x's sign)

    @triton.jit
    def expm1(x):
        # Kahan's (u - 1) * x / log(u): exp(x) - 1 lost the low digits (expm1(1e-3) was 2e-5 off
        # relatively) and made expm1(-0.0) +0.0
        u = tl.exp(x)
        r = tl.where(u == 1.0, x, (u - 1.0) * (x / tl.log(u)))
        # (selects, not | or &: the interpreter's bools of a 0-d operand cannot take them)
        return tl.where(u == float("inf"), u, tl.where(u - 1.0 == -1.0, u - 1.0, r))

    @triton.jit
    def log1p(x):
        # log(u) * x / (u - 1) for u = 1 + x (Goldberg's): log(1 + x) lost x's low digits
        u = 1.0 + x
        return tl.where(u == 1.0, x, tl.where(x == float("inf"), x, tl.log(u) * (x / (u - 1.0))))

    @triton.jit
    def log10(x):
        return tl.log(x) * 0.4342944819032518

    @triton.jit
    def sin(x):
        return tl.sin(x)

    @triton.jit
    def cos(x):
        return tl.cos(x)

    @triton.jit
    def tan(x):
        return tl.sin(x) / tl.cos(x)

    @triton.jit
    def tanh(x):
        # expm1(2x) / (expm1(2x) + 2), odd and without cancellation (1 - 2 / (exp(2x) + 1) made
        # tanh(1e-7) 0.87e-7 and tanh(-0.0) +0.0)
        t = expm1(2.0 * x)
        return tl.where(x > 20.0, 1.0, t / (t + 2.0))

    @triton.jit
    def sinh(x):
        # (u + u / (u + 1)) / 2 for u = expm1(|x|): exp(x) - exp(-x) cancelled (sinh(1e-3) was
        # 1.7e-5 off relatively); past 20, exp(|x| - log 2), finite up to 89.4 as sinh is
        ax = tl.abs(x)
        u = expm1(ax)
        r = tl.where(ax > 20.0, tl.exp(ax - 0.6931471805599453), 0.5 * (u + u / (u + 1.0)))
        return tl.where(x != x, x, tl.where(_negative(x), r * -1.0, tl.where(x == 0, x, r)))

    @triton.jit
    def cosh(x):
        ax = tl.abs(x)
        return tl.where(ax > 20.0, tl.exp(ax - 0.6931471805599453), 0.5 * (tl.exp(ax) + tl.exp(-ax)))

    @triton.jit
    def asinh(x):
        # log1p(a + a^2 / (1 + sqrt(1 + a^2))): log(a + sqrt(a^2 + 1)) lost a's low digits
        # (asinh(1e-3) was 2.3e-5 off) and a^2 overflowed past 1.8e19 (asinh(3e38) was inf);
        # the sign by a product, so asinh(-0.0) is -0.0
        ax = tl.abs(x)
        big = ax > 1e18
        a = tl.where(big, 1.0, ax)
        r = tl.where(big, tl.log(ax) + 0.6931471805599453, log1p(a + a * a / (1.0 + tl.sqrt(1.0 + a * a))))
        return tl.where(x != x, x, tl.where(_negative(x), r * -1.0, tl.where(x == 0, x, r)))

    @triton.jit
    def acosh(x):
        # log1p(t + sqrt(2t + t^2)) for t = x - 1 (exact near 1), log(x) + log 2 past 1e18 (x * x
        # overflowed: acosh(3e38) was inf, acosh(-3e38) inf, not NaN); NaN below 1
        t = tl.where(x > 1e18, 0.0, x - 1.0)
        r = tl.where(x > 1e18, tl.log(x) + 0.6931471805599453, log1p(t + tl.sqrt(2.0 * t + t * t)))
        return tl.where(x < 1.0, float("nan"), r)

    @triton.jit
    def atanh(x):
        return tl.where(tl.abs(x) < 1e-4, x, 0.5 * tl.log((1.0 + x) / (1.0 - x)))

    @triton.jit
    def erfc(x):
        # 1 - erf(x) cancels from 0.5 up (erfc(7) was 0, eager's 4.2e-23): there Numerical
        # Recipes' erfcc, relative error below 1.2e-7
        z = tl.abs(x)
        t = 1.0 / (1.0 + 0.5 * z)
        p = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
            0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
        tail = t * tl.exp(p - z * z)
        return tl.where(z < 0.5, 1.0 - tl.erf(x), tl.where(x < 0, 2.0 - tail, tail))

    @triton.jit
    def atan(x):
        # odd minimax-free form: atan(z) = 2 atan(z / (1 + sqrt(1 + z^2))), then a series, for
        # |z| <= 1; beyond, pi/2 - atan(1 / |x|) (x * x overflowed past 1.8e19: atan(3e38) was 0)
        ax = tl.abs(x)
        z = tl.where(ax > 1.0, 1.0 / ax, ax)
        y = z / (1.0 + tl.sqrt(1.0 + z * z))
        y = y / (1.0 + tl.sqrt(1.0 + y * y))
        y2 = y * y
        s = 4.0 * y * (1.0 - y2 * (1.0 / 3.0 - y2 * (1.0 / 5.0 - y2 * (1.0 / 7.0 - y2 * (1.0 / 9.0)))))
        s = tl.where(ax > 1.0, tl.full([1], 1.5707963267948966, x.dtype) - s, s)
        return tl.where(x != x, x, tl.where(x < 0, s * -1.0, tl.where(x == 0, x, s)))

    @triton.jit
    def asin(x):
        # ((1 - x)(1 + x), not 1 - x * x, which rounds away x's low digits near 1)
        return atan(x / tl.sqrt((1.0 - x) * (1.0 + x)))

    @triton.jit
    def acos(x):
        # beyond 0.5, 2 atan(sqrt((1 - x) / (1 + x))): pi/2 - asin(x) cancelled near 1
        # (acos(0.999999) was 1.8e-5 off relatively); pi in x's dtype (a Python float is float32)
        half_pi = tl.full([1], 1.5707963267948966, x.dtype)
        return tl.where(x > 0.5, 2.0 * atan(tl.sqrt((1.0 - x) / (1.0 + x))), half_pi - asin(x))

    @triton.jit
    def _negative(x):  # x < 0, -0.0 included (1 / -0.0 is -inf)
        return tl.where(x == 0, 1.0 / x < 0, x < 0)

    @triton.jit
    def atan2(y, x):
        # C's atan2 case by case (atan2(nan, 0) was 0, atan2(inf, inf) NaN, atan2(0, -0.0) 0);
        # pi in x's dtype: a Python float is a float32 constant, which float64 pi/2 was off by
        pi = tl.full([1], 3.141592653589793, x.dtype)
        ay, ax = tl.abs(y), tl.abs(x)
        q = ay / ax
        r = tl.where(q == float("inf"), pi * 0.5, atan(q))
        r = tl.where(ay == 0, 0.0, tl.where(ay == float("inf"), tl.where(ax == float("inf"), pi * 0.25, r), r))
        r = tl.where(_negative(x), pi - r, r)
        r = tl.where(_negative(y), r * -1.0, r)
        return tl.where(x != x, x, tl.where(y != y, y, r))

    @triton.jit
    def pow(a, b):
        # C's pow: pow(nan, 0) and pow(1, nan) are 1, pow(-1, +-inf) 1, a zero or an infinity of
        # a negative sign keeps it for odd integer powers (pow(-0.0, -1) is -inf, pow(-inf, 3)
        # -inf), and only a finite negative base to a fractional power is NaN
        r = tl.exp(b * tl.log(tl.abs(a)))
        # (selects, not | or &: the interpreter's bools of a 0-d operand cannot take them)
        odd = (b - 2.0 * tl.floor(b * 0.5)) == 1.0  # (an odd integer: inf - inf is NaN)
        r = tl.where(_negative(a), tl.where(odd, r * -1.0, r), r)
        r = tl.where(a < 0, tl.where(a == float("-inf"), r, tl.where(tl.floor(b) == b, r, float("nan"))), r)
        r = tl.where(b == 1, a, r)  # (exp(log(3e38)) overflowed)
        r = tl.where(a == -1, tl.where(tl.abs(b) == float("inf"), 1.0, r), r)
        return tl.where(b == 0, 1.0, tl.where(a == 1, 1.0, r))

    @triton.jit
    def exp_ftz(x):
        return tl.exp(x)

    @triton.jit
    def opaque(x):
        return x

    @triton.jit
    def fmod_float(a, b):
        # a float % is LLVM's frem, which the interpreter runs as numpy's fmod: exact, and
        # right where a - trunc(a / b) * b is not (an infinite b, a -0.0)
        return a % b
else:
    from triton.language.extra import libdevice

    @triton.jit
    def trunc(x):
        return libdevice.trunc(x)

    @triton.jit
    def rint(x):
        return libdevice.rint(x)

    @triton.jit
    def expm1(x):
        return libdevice.expm1(x)

    @triton.jit
    def log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def log10(x):
        return libdevice.log10(x)

    @triton.jit
    def sin(x):
        return libdevice.sin(x)

    @triton.jit
    def cos(x):
        return libdevice.cos(x)

    @triton.jit
    def tan(x):
        return libdevice.tan(x)

    @triton.jit
    def tanh(x):
        return libdevice.tanh(x)

    @triton.jit
    def sinh(x):
        return libdevice.sinh(x)

    @triton.jit
    def cosh(x):
        return libdevice.cosh(x)

    @triton.jit
    def asinh(x):
        return libdevice.asinh(x)

    @triton.jit
    def acosh(x):
        return libdevice.acosh(x)

    @triton.jit
    def atanh(x):
        return libdevice.atanh(x)

    @triton.jit
    def erfc(x):
        return libdevice.erfc(x)

    @triton.jit
    def atan(x):
        return libdevice.atan(x)

    @triton.jit
    def asin(x):
        return libdevice.asin(x)

    @triton.jit
    def acos(x):
        return libdevice.acos(x)

    @triton.jit
    def atan2(y, x):
        return libdevice.atan2(y, x)

    @triton.jit
    def pow(a, b):
        return libdevice.pow(a, b)

    @triton.jit
    def exp_ftz(x):
        # exp(x) as one ex2.approx.ftz: results below 2^-126 flush to zero, no subnormal
        # fix-up (three extra instructions per element in tl.exp). Only for sums of exp(x - max)
        # (online softmax, online_softmax.terms_lost_below_one), where every term below 2^-126
        # is lost next to the max's term of 1
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def opaque(x):
        # x, through a move Triton's MLIR passes cannot see through: a loop's running row max
        # starts from this, not from a constant. Triton 3.6's thread-locality pass rewrites a
        # loop whose accumulator starts from a constant and is updated by max(acc, max(load)),
        # and asserts (a compile crash) when the loop's result has more than one use, which
        # online softmax's row max can have once layouts are rematerialized (fp32 inputs).
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)

    @triton.jit
    def fmod_float(a, b):
        return libdevice.fmod(a, b)


@triton.jit
def erf_lowp(x):
    # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, far below a bfloat16/float16 ulp, for one exp
    # and a division instead of libdevice's long polynomial (GELU epilogues are compute-bound)
    ax = tl.abs(x)
    t = tl.math.fdiv(1.0, 1.0 + 0.3275911 * ax, ieee_rounding=False)  # IEEE division costs ~20 ops
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    y = 1.0 - p * tl.exp(-ax * ax)
    # below 0.25 its absolute error is most of erf itself (erf(1e-5) was 6 float16 ulps off, a
    # bfloat16 1e-7 255, and erf(-0.0) +0.0): there the series 2/sqrt(pi) (x - x^3/3 + x^5/10
    # - x^7/42), within 1e-7 of erf relatively, and odd in x as erf is
    x2 = x * x
    small = x * (1.1283791670955126 + x2 * (-0.37612638903183754 + x2 * (0.11283791670955126
                                                                         + x2 * -0.026866170645131252)))
    return tl.where(x != x, x, tl.where(ax < 0.25, small, tl.where(x < 0, -y, y)))


@triton.jit
def one_plus_erf(z):
    # 1 + erf(z) for float32 (passes/erf.py): erfc(|z|) = 2^(t R(t)) from one polynomial, where
    # libdevice's erf selects two polynomials' coefficients per element (about twice the
    # instructions). R's coefficients are codegen/c_prelude.py's ONE_PLUS_ERF_POLY.
    t = tl.abs(z)
    r = tl.full(t.shape, 1.1539782462932635e-07, tl.float32)
    r = tl.fma(r, t, -3.0300464004540117e-06)
    r = tl.fma(r, t, 3.537570228218101e-05)
    r = tl.fma(r, t, -0.00023980667174328119)
    r = tl.fma(r, t, 0.0010127660352736712)
    r = tl.fma(r, t, -0.00242486409842968)
    r = tl.fma(r, t, 0.00010724039748311043)
    r = tl.fma(r, t, 0.02779647707939148)
    r = tl.fma(r, t, -0.14836527407169342)
    r = tl.fma(r, t, -0.918427050113678)
    r = tl.fma(r, t, -1.6279085874557495)
    e = tl.math.exp2(t * r)
    e = tl.where(t > 4.0, 0.0, e)
    return tl.where(z < 0, e, 2.0 - e)


@triton.jit
def sign(x):  # (NaN -> 0, as eager's sign)
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)


@triton.jit
def isinf(x):
    return tl.abs(x) == float("inf")


@triton.jit
def div_ieee(a, b):
    # a rounding division's quotient correctly rounded, as eager's: Triton's float32 / is
    # div.full.f32 (2 ulp), and trunc(2.0000 - 1 ulp) is 1 (float64's / is IEEE already)
    if a.dtype == tl.float32:
        return tl.math.div_rn(a, b)
    else:
        return a / b


@triton.jit
def floordiv_float(a, b):
    # torch.div(rounding_mode="floor") on floats, step for step
    mod = fmod_float(a, b)
    div = div_ieee(a - mod, b)
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    # a zero takes the sign of a / b (eager's copysign: -0.0 // 2.5 is -0.0); a select of the
    # constants -0.0 and 0.0 gave +0.0 for a quotient of -0.0
    fl = tl.where(div == 0, div_ieee(a, b) * 0.0, fl)
    return tl.where(b == 0, a / b, fl)


@triton.jit
def truncdiv_float(a, b):
    return trunc(div_ieee(a, b))


@triton.jit
def mod_float(a, b):
    m = fmod_float(a, b)
    return tl.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


@triton.jit
def round_bf16(x):
    return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def round_f16(x):
    return x.to(tl.float16).to(tl.float32)


@triton.jit
def floordiv_bf16(a, b):
    # eager runs the algorithm on bfloat16 values, rounding every step
    mod = round_bf16(fmod_float(a, b))
    div = round_bf16(div_ieee(round_bf16(a - mod), b))
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), round_bf16(div - 1.0), div)
    fl = tl.floor(div)
    fl = tl.where(round_bf16(div - fl) > 0.5, round_bf16(fl + 1.0), fl)
    fl = tl.where(div == 0, round_bf16(div_ieee(a, b)) * 0.0, fl)
    return tl.where(b == 0, round_bf16(a / b), fl)


@triton.jit
def floordiv_f16(a, b):
    mod = round_f16(fmod_float(a, b))
    div = round_f16(div_ieee(round_f16(a - mod), b))
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), round_f16(div - 1.0), div)
    fl = tl.floor(div)
    fl = tl.where(round_f16(div - fl) > 0.5, round_f16(fl + 1.0), fl)
    fl = tl.where(div == 0, round_f16(div_ieee(a, b)) * 0.0, fl)
    return tl.where(b == 0, round_f16(a / b), fl)


@triton.jit
def truncdiv_bf16(a, b):
    return trunc(round_bf16(div_ieee(a, b)))


@triton.jit
def truncdiv_f16(a, b):
    return trunc(round_f16(div_ieee(a, b)))


@triton.jit
def mod_bf16(a, b):
    m = round_bf16(fmod_float(a, b))
    return tl.where((m != 0) & ((b < 0) != (m < 0)), round_bf16(m + b), m)


@triton.jit
def mod_f16(a, b):
    m = round_f16(fmod_float(a, b))
    return tl.where((m != 0) & ((b < 0) != (m < 0)), round_f16(m + b), m)


# ---- scans ----------------------------------------------------------------------------------

@triton.jit
def logaddexp(a, b):
    """logcumsumexp's combine, as eager's step (log1p(exp(lo - hi)) + hi): NaN propagates, and
    two equal infinities give that infinity (their difference would be NaN)."""
    lo = tl.where(a < b, a, b)
    hi = tl.where(a < b, b, a)
    same_inf = (lo == hi) & (tl.abs(lo) == float("inf"))
    out = log1p(tl.exp(tl.where(same_inf, 0.0, lo) - tl.where(same_inf, 1.0, hi))) + hi
    return tl.where((a != a) | (b != b), a + b, tl.where(same_inf, a, out))


@triton.jit
def scan_max(a, b):
    """cummax's combine, as eager's step: b, the later, replaces a where it is NaN, or a is not
    and b >= a (ties take the later: -0.0 replaces 0.0)."""
    return tl.where((b != b) | ((a == a) & (b >= a)), b, a)


@triton.jit
def scan_min(a, b):
    return tl.where((b != b) | ((a == a) & (b <= a)), b, a)
