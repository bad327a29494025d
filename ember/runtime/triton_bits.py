"""Triton helpers for the sign and magnitude ops, integer gcd/lcm and int16 wrap-around (hypot,
copysign, signbit, nextafter, integer abs, gcd, lcm, wrap_i16), which generated kernels call as
``eh.<name>`` (triton_helpers.py imports them). As there, hypot and nextafter come from libdevice
on a GPU and are written with ``tl`` primitives under ``TRITON_INTERPRET=1``; the others are bit
and integer arithmetic, exact on both."""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def signbit(x):
    # the sign bit itself (-0.0 and a negative NaN count), as eager's
    if x.dtype == tl.float64:
        s = x.to(tl.int64, bitcast=True) < 0
    else:
        s = x.to(tl.int32, bitcast=True) < 0
    return s


@triton.jit
def copysign(a, b):
    # bits, not a product by -1: a NaN keeps and takes signs exactly, as C's copysign
    if a.dtype == tl.float64:
        mask = 0x7FFFFFFFFFFFFFFF
        r = ((a.to(tl.int64, bitcast=True) & mask) | (b.to(tl.int64, bitcast=True) & ~mask)).to(a.dtype, bitcast=True)
    else:
        mask = 0x7FFFFFFF
        r = ((a.to(tl.int32, bitcast=True) & mask) | (b.to(tl.int32, bitcast=True) & ~mask)).to(a.dtype, bitcast=True)
    return r


if INTERPRET:
    @triton.jit
    def iabs(x):
        return tl.abs(x)  # (numpy's: |INT_MIN| wraps to INT_MIN, as eager's)

    @triton.jit
    def wrap_i16(x):
        return x.to(tl.int16)
else:
    @triton.jit
    def iabs(x):
        # |x| of a signed int, wrapping at INT_MIN, in PTX that LLVM cannot turn into abs.s16/
        # .s32/.s64: ptxas takes their results as >= 0. It kept int16 |-32768| as +32768 in its
        # 32-bit register (abs(-32768) % 5 was 3, eager's 2), and dropped a floor division's
        # rounding down of |INT_MIN|. Narrow ints go through int32 and are cut back.
        if x.dtype.primitive_bitwidth == 64:
            r = tl.inline_asm_elementwise(
                "{ .reg .pred n; setp.lt.s64 n, $1, 0; neg.s64 $0, $1; selp.b64 $0, $0, $1, n; }",
                "=l,l", [x], dtype=tl.int64, is_pure=True, pack=1)
        else:
            r = tl.inline_asm_elementwise(
                "{ .reg .pred n; setp.lt.s32 n, $1, 0; neg.s32 $0, $1; selp.b32 $0, $0, $1, n; }",
                "=r,r", [x.to(tl.int32)], dtype=tl.int32, is_pure=True, pack=1).to(x.dtype)
        return r

    @triton.jit
    def wrap_i16(x):
        # an int32 result of int16 operands as int16, through PTX LLVM cannot see into: it
        # narrowed int16 negation (0 - x, x * -1, x // -1) to neg.s16, and ptxas took that
        # result as sign-extended, so -(-32768) was +32768 to a widening or a comparison after
        # it ((-x) // -3 gave -10923 on an H100, eager's 10922). bfe.s32 extends bit 15
        r = tl.inline_asm_elementwise("bfe.s32 $0, $1, 0, 16;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
        return r.to(tl.int16)


# ---- gcd, lcm: ATen's calc_gcd and lcm step for step ----------------------------------------


@triton.jit
def gcd(a, b):
    # |INT_MIN| stays INT_MIN (gcd(INT_MIN, 0) is INT_MIN, as eager). Euclid takes at most ~1.5
    # steps per bit (consecutive Fibonacci numbers are the worst case): a fixed loop, lanes that
    # are done keep their answer
    a = iabs(a)
    b = iabs(b)
    bits: tl.constexpr = a.dtype.primitive_bitwidth
    for _ in range(bits + bits // 2):
        nonzero = a != 0
        c = a
        a = tl.where(nonzero, b % tl.where(nonzero, a, 1), 0)
        b = tl.where(nonzero, c, b)
    return b


@triton.jit
def lcm(a, b):
    # |a / g * b| in C's promoted type: int for 8 and 16 bits (exact, then truncated), else the
    # element type, wrapping; 0 where g is 0
    g = gcd(a, b)
    if a.dtype.primitive_bitwidth < 32:
        wa = a.to(tl.int32)
        wb = b.to(tl.int32)
        wg = g.to(tl.int32)
    else:
        wa = a
        wb = b
        wg = g
    # (g is -1 for gcd(INT_MIN, INT_MAX), where eager's INT_MIN / -1 traps: here it wraps)
    p = tl.where(wg == -1, -wa, wa // tl.where((wg == 0) | (wg == -1), 1, wg)) * wb
    return tl.where(wg == 0, 0, iabs(p)).to(a.dtype)


if INTERPRET:
    @triton.jit
    def hypot(a, b):
        # max * sqrt(1 + (min / max)^2): no overflow or underflow of the squares; an infinity
        # wins over a NaN, as C's hypot
        ax, ay = tl.abs(a), tl.abs(b)
        m = tl.where(ax > ay, ax, ay)
        n = tl.where(ax > ay, ay, ax)
        q = n / tl.where(m == 0, 1.0, m)
        r = tl.where(m == 0, m, m * tl.sqrt(1.0 + q * q))
        r = tl.where((ax != ax), ax, tl.where(ay != ay, ay, r))
        return tl.where(ax == float("inf"), ax, tl.where(ay == float("inf"), ay, r))

    @triton.jit
    def nextafter(a, b):
        # a's bits stepped by one: up where that moves away from zero towards b
        if a.dtype == tl.float64:
            bits = a.to(tl.int64, bitcast=True)
            tiny = tl.full([1], 1, tl.int64).to(tl.float64, bitcast=True)
        else:
            bits = a.to(tl.int32, bitcast=True)
            tiny = tl.full([1], 1, tl.int32).to(tl.float32, bitcast=True)
        step = tl.where((a < b) == (a > 0), bits + 1, bits - 1).to(a.dtype, bitcast=True)
        r = tl.where(a == 0, copysign(tiny + a * 0.0, b), step)
        r = tl.where(a == b, b, r)
        return tl.where(a != a, a, tl.where(b != b, b, r))
else:
    from triton.language.extra import libdevice

    @triton.jit
    def hypot(a, b):
        return libdevice.hypot(a, b)

    @triton.jit
    def nextafter(a, b):
        return libdevice.nextafter(a, b)
