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
    result = tl.full(base.shape, 1, base.dtype)
    b = base
    e = exp
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
        return tl.where(x < 0, -tl.floor(-x), tl.floor(x))

    @triton.jit
    def rint(x):
        # round half to even
        f = tl.floor(x)
        d = x - f
        even = (f - 2.0 * tl.floor(f * 0.5)) == 0
        up = (d > 0.5) | ((d == 0.5) & ~even)
        return tl.where(x != x, x, tl.where(up, f + 1.0, f))

    @triton.jit
    def expm1(x):
        return tl.where(tl.abs(x) < 1e-5, x + 0.5 * x * x, tl.exp(x) - 1.0)

    @triton.jit
    def log1p(x):
        return tl.where(tl.abs(x) < 1e-4, x - 0.5 * x * x, tl.log(1.0 + x))

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
        ax = tl.abs(x)
        t = 1.0 - 2.0 / (tl.exp(2.0 * ax) + 1.0)
        t = tl.where(ax < 1e-3, ax - ax * ax * ax / 3.0, t)
        return tl.where(x != x, x, tl.where(x < 0, -t, t))

    @triton.jit
    def sinh(x):
        return tl.where(tl.abs(x) < 1e-4, x, 0.5 * (tl.exp(x) - tl.exp(-x)))

    @triton.jit
    def cosh(x):
        return 0.5 * (tl.exp(x) + tl.exp(-x))

    @triton.jit
    def asinh(x):
        ax = tl.abs(x)
        r = tl.where(ax < 1e-4, ax, tl.log(ax + tl.sqrt(ax * ax + 1.0)))
        return tl.where(x < 0, -r, r)

    @triton.jit
    def acosh(x):
        return tl.log(x + tl.sqrt(x * x - 1.0))

    @triton.jit
    def atanh(x):
        return tl.where(tl.abs(x) < 1e-4, x, 0.5 * tl.log((1.0 + x) / (1.0 - x)))

    @triton.jit
    def erfc(x):
        return 1.0 - tl.erf(x)

    @triton.jit
    def atan(x):
        # odd minimax-free form: atan(x) = 2 atan(x / (1 + sqrt(1 + x^2))), then a series
        y = x / (1.0 + tl.sqrt(1.0 + x * x))
        y = y / (1.0 + tl.sqrt(1.0 + y * y))
        y2 = y * y
        s = y * (1.0 - y2 * (1.0 / 3.0 - y2 * (1.0 / 5.0 - y2 * (1.0 / 7.0 - y2 * (1.0 / 9.0)))))
        return 4.0 * s

    @triton.jit
    def asin(x):
        return atan(x / tl.sqrt(1.0 - x * x))

    @triton.jit
    def acos(x):
        return 1.5707963267948966 - asin(x)

    @triton.jit
    def atan2(y, x):
        a = atan(y / x)
        a = tl.where(x < 0, tl.where(y >= 0, a + 3.141592653589793, a - 3.141592653589793), a)
        return tl.where(x == 0, tl.where(y > 0, 1.5707963267948966, tl.where(y < 0, -1.5707963267948966, 0.0)), a)

    @triton.jit
    def pow(a, b):
        r = tl.exp(b * tl.log(tl.abs(a)))
        whole = tl.floor(b) == b
        odd = (b - 2.0 * tl.floor(b * 0.5)) == 1.0
        r = tl.where(a < 0, tl.where(whole, tl.where(odd, -r, r), float("nan")), r)
        return tl.where(b == 0, 1.0, tl.where(a == 0, tl.where(b > 0, 0.0, float("inf")), r))

    @triton.jit
    def exp_ftz(x):
        return tl.exp(x)

    @triton.jit
    def opaque(x):
        return x

    @triton.jit
    def fmod_float(a, b):
        return a - trunc(a / b) * b
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
        # (online softmax), where every term below 2^-126 is lost next to the max's term of 1
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
    return tl.where(x != x, x, tl.where(x < 0, -y, y))


@triton.jit
def sign(x):  # (NaN -> 0, as eager's sign)
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)


@triton.jit
def isinf(x):
    return tl.abs(x) == float("inf")


@triton.jit
def floordiv_float(a, b):
    # torch.div(rounding_mode="floor") on floats, step for step
    mod = fmod_float(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, tl.where(a / b < 0, -0.0, 0.0), fl)
    return tl.where(b == 0, a / b, fl)


@triton.jit
def truncdiv_float(a, b):
    return trunc(a / b)


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
    div = round_bf16(round_bf16(a - mod) / b)
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), round_bf16(div - 1.0), div)
    fl = tl.floor(div)
    fl = tl.where(round_bf16(div - fl) > 0.5, round_bf16(fl + 1.0), fl)
    fl = tl.where(div == 0, tl.where(round_bf16(a / b) < 0, -0.0, 0.0), fl)
    return tl.where(b == 0, round_bf16(a / b), fl)


@triton.jit
def floordiv_f16(a, b):
    mod = round_f16(fmod_float(a, b))
    div = round_f16(round_f16(a - mod) / b)
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), round_f16(div - 1.0), div)
    fl = tl.floor(div)
    fl = tl.where(round_f16(div - fl) > 0.5, round_f16(fl + 1.0), fl)
    fl = tl.where(div == 0, tl.where(round_f16(a / b) < 0, -0.0, 0.0), fl)
    return tl.where(b == 0, round_f16(a / b), fl)


@triton.jit
def truncdiv_bf16(a, b):
    return trunc(round_bf16(a / b))


@triton.jit
def truncdiv_f16(a, b):
    return trunc(round_f16(a / b))


@triton.jit
def mod_bf16(a, b):
    m = round_bf16(fmod_float(a, b))
    return tl.where((m != 0) & ((b < 0) != (m < 0)), round_bf16(m + b), m)


@triton.jit
def mod_f16(a, b):
    m = round_f16(fmod_float(a, b))
    return tl.where((m != 0) & ((b < 0) != (m < 0)), round_f16(m + b), m)
