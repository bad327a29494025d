"""The C++ backend's float32 math without libm calls (included in codegen/cpp_prelude.py's PRELUDE).

glibc's float functions have no vector forms GCC can use (libmvec's need -ffast-math, and differ
from the scalar ones in their last bits), so a simd loop calling expf, logf or atan2f ran one
element at a time: 3-10x slower than eager's vectorized kernels. These are branch-free, so GCC
vectorizes a loop that calls them, and give the same bits in every lane. float32, bfloat16 and
float16 use them (codegen/cpp.py's fast_f32). float64 keeps libm but for exp, expm1, tanh, log
and log1p (fast_f64; their errors against mpmath over samples are checked by
tests/test_cpu_math.py) and a pow that only float32 casts read (eager's float32 x ** scalar
computes in double), which ember_pow_narrow computes in double to within 1e-13
(codegen/cstyle.py: _narrowed_pow). Each float32 function's error over all 2^32 inputs (atan2
and pow: 2^32 pairs) is checked by tools/check_cpu_math.py; run it after any change.
"""


def _two_over_pi_bits(n: int) -> int:
    """floor(2^n * 2/pi), from Machin's formula pi = 16 atan(1/5) - 4 atan(1/239) in integers
    with 64 guard bits (exact in every bit sin, cos and tan use: tests/test_cpu_math.py checks it
    against mpmath)."""
    g = n + 64

    def atan_inv(k: int) -> int:  # atan(1/k) 2^g
        total, power, i = 0, (1 << g) // k, 0
        while power:
            total += (-1) ** i * (power // (2 * i + 1))
            power //= k * k
            i += 1
        return total

    pi = 16 * atan_inv(5) - 4 * atan_inv(239)
    return (1 << (n + 1 + g)) // pi


def two_over_pi_words() -> list[str]:
    """The first 256 bits of 2/pi's fraction as eight 32-bit words, C literals."""
    t = _two_over_pi_bits(256)
    return [f"0x{(t >> (224 - 32 * i)) & 0xffffffff:08x}u" for i in range(8)]


def _picked_words() -> str:
    """ember_half_turn_parts' four words of 2/pi from word i on, i = 0..3: selects among literals
    (a table read at i would be a gather, which GCC does not vectorize on every x86, and a chain
    of i == k tests it turns into one)."""
    w = two_over_pi_words()
    return "\n".join(f"  uint32_t w{k} = upper ? (odd ? {w[k + 3]} : {w[k + 2]}) : (odd ? {w[k + 1]} : {w[k]});"
                      for k in range(4))


def _near_part(k: int) -> str:
    """ember_half_turn_parts' part k for s = 1 (2/pi's bits 28k + 1 to 28k + 28), a C double."""
    t = _two_over_pi_bits(84)
    return float.hex(((t >> (56 - 28 * k)) & ((1 << 28) - 1)) * 2.0 ** -(28 * k + 28))


MATH = r"""
// The math helpers spell their fused multiply-adds (std::fma): kernels build with
// -ffp-contract=off, so user arithmetic rounds as eager's, and the polynomials keep their FMAs.
// exp's and expm1's reduction: x clamped to [lo, hi] as k ln2 + r, |r| <= ln2 / 2; returns k.
// (Cody-Waite: ln2 in two parts, k 0.693359375 exact.)
EMBER_FN float ember_ln2_split(float x, float lo, float hi, float& r) {
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  float k = std::nearbyint(xc * 1.44269504088896341f);
  r = std::fma(k, 2.12194440e-4f, std::fma(-k, 0.693359375f, xc));
  return k;
}
// exp for float32 without libm calls, so loops that use it vectorize: Cody-Waite reduction and
// a degree-6 polynomial (max error 1.023 ulp), 2^k applied in two halves to reach subnormals.
// The clamp alone decides the ends: below -104 p 2^-150 rounds to 0, past 88.72 to inf, and a
// NaN stays NaN through p (all 2^32 inputs give the bits that explicit selects for 0, inf and
// NaN gave; three selects fewer made bf16 softmax 11% faster: bench/RESULTS.md). After any
// change: python tools/check_cpu_math.py exp (every input against float64's exp).
// ember_exp_halved: exp(x) / 2^halve, x clamped to [-104, hi] (cosh and sinh: exp(x) / 2 is
// finite up to 89.4159, where exp(x) is not).
EMBER_FN float ember_exp_halved(float x, float hi, int32_t halve) {
  float r;
  float k = ember_ln2_split(x, -104.0f, hi, r);
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p * r, r, r) + 1.0f;
  int32_t ki = (int32_t)k - halve;
  int32_t k1 = ki >> 1, k2 = ki - k1;  // (any split whose halves are exponents; a shift is one op)
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float f1, f2; std::memcpy(&f1, &b1, 4); std::memcpy(&f2, &b2, 4);
  return p * f1 * f2;
}
EMBER_FN float ember_exp(float x) { return ember_exp_halved(x, 89.0f, 0); }
// exp and expm1 for float64 without libm calls (glibc's have no vector form GCC may use: a loop
// calling them ran one element at a time, 0.3x Inductor's). x = k ln2 + r with k = round(x / ln2)
// read from the low bits of t = x / ln2 + 1.5 2^52 (no float-to-int conversion: AVX2 has none for
// 64-bit lanes); r = rh + rl, rh = x - k ln2_hi exact (ln2_hi has 32 bits, |k| <= 1077); e^r =
// 1 + r + r^2 q(r), q Taylor's to r^13 (remainder under 2^-57 on |r| <= 0.35). Returns r^2 q.
EMBER_FN double ember_exp_reduced_f64(double xc, double& t, double& rh, double& rl) {
  const double shift = 0x1.8p52;
  t = xc * 1.4426950408889634 + shift;
  double k = t - shift;
  rh = xc - k * 6.93147180369123816490e-01;
  rl = -(k * 1.90821492927058770002e-10);
  double r = rh + rl;
  double q = 1.0 / 6227020800.0;
  q = std::fma(q, r, 1.0 / 479001600.0);
  q = std::fma(q, r, 1.0 / 39916800.0);
  q = std::fma(q, r, 1.0 / 3628800.0);
  q = std::fma(q, r, 1.0 / 362880.0);
  q = std::fma(q, r, 1.0 / 40320.0);
  q = std::fma(q, r, 1.0 / 5040.0);
  q = std::fma(q, r, 1.0 / 720.0);
  q = std::fma(q, r, 1.0 / 120.0);
  q = std::fma(q, r, 1.0 / 24.0);
  q = std::fma(q, r, 1.0 / 6.0);
  q = std::fma(q, r, 0.5);
  return r * r * q;
}
// 2^k for k from t above, as two factors whose product reaches subnormals and inf; returns k
EMBER_FN int64_t ember_pow2_halves_f64(double t, double& f1, double& f2) {
  const double shift = 0x1.8p52;
  double th = (t - shift) * 0.5 + shift;
  uint64_t tb, sb, hb;
  std::memcpy(&tb, &t, 8); std::memcpy(&sb, &shift, 8); std::memcpy(&hb, &th, 8);
  int64_t k = (int64_t)(tb - sb), k1 = (int64_t)(hb - sb);
  uint64_t b1 = (uint64_t)(k1 + 1023) << 52, b2 = (uint64_t)(k - k1 + 1023) << 52;
  std::memcpy(&f1, &b1, 8); std::memcpy(&f2, &b2, 8);
  return k;
}
// exp: 1 + rh split exactly (Fast2Sum) so the sum rounds once: 0.62 ulp at most over
// tests/test_cpu_math.py's samples against mpmath. The clamp decides the ends as in ember_exp.
EMBER_FN double ember_exp_f64(double x) {
  double xc = x < -746.0 ? -746.0 : x;
  xc = xc > 710.0 ? 710.0 : xc;
  double t, rh, rl, f1, f2;
  double tail = ember_exp_reduced_f64(xc, t, rh, rl);
  double hi = 1.0 + rh;
  double lo = (1.0 - hi) + rh;
  double p = hi + (lo + (rl + tail));
  ember_pow2_halves_f64(t, f1, f2);
  return p * f1 * f2;
}
// expm1 = 2^k expm1(r) + (2^k - 1), both exact to scale up to |k| = 60 (one fma rounds); past
// k = 53, where 2^k - 1 is 2^k, (expm1(r) + 1) 2^k. x clamped to [-40, 710] (below -37.5 it
// rounds to -1); |x| < 2^-54 (zeros, subnormals) and NaN give x. 1.42 ulp at most over the samples.
EMBER_FN double ember_expm1_f64(double x) {
  double xc = x < -40.0 ? -40.0 : x;
  xc = xc > 710.0 ? 710.0 : xc;
  double t, rh, rl, f1, f2;
  double em = rh + (rl + ember_exp_reduced_f64(xc, t, rh, rl));
  int64_t k = ember_pow2_halves_f64(t, f1, f2);
  int64_t kc = k > 60 ? 60 : (k < -60 ? -60 : k);
  uint64_t bc = (uint64_t)(kc + 1023) << 52;
  double p2;
  std::memcpy(&p2, &bc, 8);
  double y = k > 53 ? (em + 1.0) * f1 * f2 : std::fma(p2, em, p2 - 1.0);
  return std::fabs(x) < 0x1p-54 || x != x ? x : y;
}
// tanh = expm1(2|x|) / (expm1(2|x|) + 2) with x's sign (|x| clamped to 20, where it rounds to 1):
// 2.1 ulp at most over the samples (glibc's own bound is 2).
EMBER_FN double ember_tanh_f64(double x) {
  double a = std::fabs(x);
  double e = ember_expm1_f64(2.0 * (a > 20.0 ? 20.0 : a));
  return x != x ? x : std::copysign(e / (e + 2.0), x);
}
// log for float64 without libm: x = 2^k m with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^54
// first), f = m - 1 (exact), s = f / (2 + f), so log m = log((1 + s) / (1 - s)) = 2s + s z R(z),
// z = s^2, R the series 2/3 + 2z/5 + 2z^2/7 + ... to z^10 (remainder under 2^-58 for z <= 0.0295),
// summed as f - (f^2/2 - s (f^2/2 + z R)), whose large terms are exact; k ln2 in two parts.
// 0.80 ulp at most over tests/test_cpu_math.py's samples against mpmath; 0, inf, negatives and NaN
// by selects.
EMBER_FN double ember_log_f64(double x) {
  const double sqrt_half = 0x1.6a09e667f3bcdp-1;
  bool tiny = x < 0x1p-1022;
  double xs = tiny ? x * 0x1p54 : x;
  uint64_t ix, hb;
  std::memcpy(&ix, &xs, 8); std::memcpy(&hb, &sqrt_half, 8);
  uint64_t iu = ix + (0x3ff0000000000000ull - hb);
  double k = (double)((int64_t)(iu >> 52) - 1023) - (tiny ? 54.0 : 0.0);
  uint64_t im = (iu & 0x000fffffffffffffull) + hb;
  double m;
  std::memcpy(&m, &im, 8);
  double f = m - 1.0;
  double s = f / (2.0 + f), z = s * s;
  double r = 2.0 / 23.0;
  r = std::fma(r, z, 2.0 / 21.0);
  r = std::fma(r, z, 2.0 / 19.0);
  r = std::fma(r, z, 2.0 / 17.0);
  r = std::fma(r, z, 2.0 / 15.0);
  r = std::fma(r, z, 2.0 / 13.0);
  r = std::fma(r, z, 2.0 / 11.0);
  r = std::fma(r, z, 2.0 / 9.0);
  r = std::fma(r, z, 2.0 / 7.0);
  r = std::fma(r, z, 2.0 / 5.0);
  r = std::fma(r, z, 2.0 / 3.0);
  double hfsq = 0.5 * f * f;
  double y = k * 6.93147180369123816490e-01
             - ((hfsq - (s * (hfsq + z * r) + k * 1.90821492927058770002e-10)) - f);
  y = x == (double)INFINITY ? x : y;
  y = x == 0.0 ? -(double)INFINITY : y;
  return x < 0.0 || x != x ? (double)NAN : y;
}
// log1p = log(u) + (x - (u - 1)) / u with u = 1 + x rounded: the quotient puts back what the
// rounding of u lost (exact to first order); below |x| = 1e-4, where those two terms are alike
// (1.43 ulp at -1.7e-16), x - x^2/2 + ... + x^5/5 instead (the rest under 2^-70 of it). Zeros
// give x; -1 gives -inf, inf inf, below -1 and NaN NaN (through log). Under 1 ulp over
// tests/test_cpu_math.py's samples.
EMBER_FN double ember_log1p_f64(double x) {
  double u = 1.0 + x;
  double y = ember_log_f64(u) + (x - (u - 1.0)) / u;
  y = u == 0.0 || x == (double)INFINITY ? ember_log_f64(u) : y;
  double small = x + x * x * std::fma(x, std::fma(x, std::fma(x, 0.2, -0.25), 1.0 / 3.0), -0.5);
  return std::fabs(x) < 1e-4 ? small : y;
}
// 2^x: k = round(x), r = x - k (exact), 2^r = 1 + r Q(r) on |r| <= 1/2 (Q from
// tools/fit_cpu_math.py), 2^k in two halves as in exp. x is clamped to [-160, 130], past both ends
// (2^-160 rounds to 0, 2^130 to inf); NaN stays NaN through r.
EMBER_FN float ember_exp2(float x) {
  float xc = x < -160.0f ? -160.0f : x;
  xc = xc > 130.0f ? 130.0f : xc;
  float k = std::nearbyint(xc), r = xc - k;
  float q = std::fma(std::fma(std::fma(std::fma(std::fma(std::fma(1.5165644072e-05f, r, 1.5467044432e-04f), r,
      1.3334081741e-03f), r, 9.6180373803e-03f), r, 5.5504102260e-02f), r, 2.4022650719e-01f), r, 6.9314718246e-01f);
  float p = std::fma(r, q, 1.0f);
  int32_t ki = (int32_t)k;
  int32_t k1 = ki >> 1, k2 = ki - k1;
  return p * ember_bits_f32((uint32_t)(k1 + 127) << 23) * ember_bits_f32((uint32_t)(k2 + 127) << 23);
}
// expm1 and log1p for float32 without libm calls (glibc's expm1f and log1pf have no vector forms:
// a loop calling them ran one element at a time, ELU and softplus 3-6x eager). Coefficients from
// tools/fit_log1p_expm1.py; after any change: python tools/check_cpu_math.py (every input).
// expm1(x) = 2^k expm1(r) + (2^k - 1), x = k ln2 + r: no cancellation at k = 0, where it matters.
// x is clamped to [-30, 89] (below -17.4 it rounds to -1; past 88.7228 to inf); 2^k for k = 128
// would be inf, so 2^127 and a doubling. |x| < 2^-25 (0, -0, subnormals) and NaN give x.
EMBER_FN float ember_expm1(float x) {
  float r;
  float k = ember_ln2_split(x, -30.0f, 89.0f, r);
  float p = std::fma(std::fma(std::fma(std::fma(1.9778760907e-04f, r, 1.3933645096e-03f), r, 8.3335014060e-03f),
                              r, 4.1666477919e-02f), r, 1.6666665673e-01f);
  float e = std::fma(r * r, std::fma(r, p, 0.5f), r);  // expm1(r)
  int32_t ki = (int32_t)k;
  int32_t kc = ki > 127 ? 127 : ki;
  float t = ember_bits_f32((uint32_t)(kc + 127) << 23);  // 2^k
  // 2^k - 1 is exact up to k = 24; from 25 on, 2^k (e - 2^-k) + 2^k instead (one rounding of a
  // tiny term, where 2^k - 1 would round by half an ulp of the result)
  float tiny = ember_bits_f32((uint32_t)(127 - (kc < 25 ? 25 : kc)) << 23);  // 2^-k
  float y = ki < 25 ? std::fma(e, t, t - 1.0f) : std::fma(e - tiny, t, t);
  y = ki > 127 ? y * 2.0f : y;
  float ax = std::fabs(x);
  return (ax < 0x1p-25f || x != x) ? x : y;
}
// log(2^k m) + c, m = 1 + f in [sqrt(1/2), sqrt(2)), c small: log(m) = f - f^2/2 + s (f^2/2 +
// z Q(z)), s = f / (2 + f), z = s^2. ln2 in two parts, the first with 16 bits (k ln2_hi exact).
EMBER_FN float ember_log_q(float z) {
  return std::fma(std::fma(2.9861149192e-01f, z, 3.9978012443e-01f), z, 6.6666769981e-01f);
}
EMBER_FN float ember_log_step(float k, float f, float c) {
  float s = f / (2.0f + f);
  float z = s * s;
  float hfsq = 0.5f * f * f;
  return std::fma(k, 0.693145751953125f,
                  -((hfsq - (s * std::fma(z, ember_log_q(z), hfsq) + std::fma(k, 1.4286068203094173e-06f, c))) - f));
}
// log(1 + f) as hi + lo, hi = f - f^2/2 rounded and lo what it left out, exactly up to the
// polynomial's term (f - hi and its difference from f^2/2 are exact: Sterbenz; the fma gives
// f^2/2's rounding): log2 and log10 scale both parts, so they need not scale log's rounding too
EMBER_FN float ember_log_parts(float f, float& lo) {
  float s = f / (2.0f + f);
  float z = s * s;
  float hfsq = 0.5f * f * f;
  float hi = f - hfsq;
  lo = (((f - hi) - hfsq) - std::fma(0.5f * f, f, -hfsq)) + s * std::fma(z, ember_log_q(z), hfsq);
  return hi;
}
// log1p(x): 1 + x = 2^k m, and c the rounding error of 1 + x relative to it. |x| < 2^-24 (0, -0,
// subnormals), inf and NaN give x; -1 gives -inf, below -1 NaN.
EMBER_FN float ember_log1p(float x) {
  float u = 1.0f + x;
  uint32_t iu = ember_f32_bits(u) + (0x3f800000u - 0x3f3504f3u);
  int32_t ki = (int32_t)(iu >> 23) - 127;
  float m = ember_bits_f32((iu & 0x007fffffu) + 0x3f3504f3u);
  // (u - 1 is exact below 2^24, and then x - (u - 1) too: Sterbenz; above, u - x is)
  float c = (ki < 24 ? x - (u - 1.0f) : 1.0f - (u - x)) / u;
  float y = ember_log_step((float)ki, m - 1.0f, c);
  float ax = std::fabs(x);
  y = (ax < 0x1p-24f || ax == INFINITY || x != x) ? x : y;
  return x <= -1.0f ? (x == -1.0f ? -INFINITY : NAN) : y;
}
// log, log2 and log10 for float32 without libm calls (glibc's logf has no vector form either):
// log1p's step without its correction. Subnormals are scaled by 2^23 first. inf and NaN give x,
// 0 and -0 -inf, negatives NaN. After any change: python tools/check_cpu_math.py log log2 log10.
EMBER_FN float ember_log_reduce(float x, float& k) {  // x = 2^k (1 + f): returns f
  bool tiny = x < 0x1p-126f;
  uint32_t ix = ember_f32_bits(tiny ? x * 0x1p23f : x) + (0x3f800000u - 0x3f3504f3u);
  k = (float)((int32_t)(ix >> 23) - (tiny ? 150 : 127));
  return ember_bits_f32((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
}
EMBER_FN float ember_log_ends(float x, float y) {
  y = (x == INFINITY || x != x) ? x : y;
  return x <= 0.0f ? (x == 0.0f ? -INFINITY : NAN) : y;
}
EMBER_FN float ember_log(float x) {
  float k, f = ember_log_reduce(x, k);
  return ember_log_ends(x, ember_log_step(k, f, 0.0f));
}
// k + log(m) / ln2, and k log10(2) + log(m) / ln10: the constants in two parts each
EMBER_FN float ember_log2(float x) {
  float k, lo, f = ember_log_reduce(x, k);
  float hi = ember_log_parts(f, lo);
  float t = std::fma(hi, 1.4426950216e+00f, std::fma(lo, 1.4426950216e+00f, (hi + lo) * 1.9259630335e-08f));
  return ember_log_ends(x, k + t);
}
EMBER_FN float ember_log10(float x) {
  float k, lo, f = ember_log_reduce(x, k);
  float hi = ember_log_parts(f, lo);
  float small = std::fma(lo, 4.3429449201e-01f, std::fma(k, -1.4320988839e-08f, (hi + lo) * -1.0103049952e-08f));
  return ember_log_ends(x, std::fma(k, 3.0103000998e-01f, std::fma(hi, 4.3429449201e-01f, small)));
}
// cosh and sinh from exp: h = exp(|x|) / 2, cosh = h + 1 / (4h); sinh = h - 1 / (4h) from
// |x| = 1 on, and below a + a^3 P(a^2), a = |x| (no cancellation near 0; P from tools/fit_cpu_math.py).
// h is computed as 2^(k - 1) p, finite up to 89.4159 where exp(|x|) is not.
EMBER_FN float ember_cosh(float x) {
  float h = ember_exp_halved(std::fabs(x), 90.0f, 1);
  return h + 0.25f / h;
}
EMBER_FN float ember_sinh(float x) {
  float a = std::fabs(x), z = a * a;
  float p = std::fma(std::fma(std::fma(2.8164904506e-06f, z, 1.9836254069e-04f), z, 8.3333496004e-03f),
                     z, 1.6666667163e-01f);
  float h = ember_exp_halved(a, 90.0f, 1);
  float y = a < 1.0f ? std::fma(a * z, p, a) : h - 0.25f / h;
  return std::copysign(y, x);  // (NaN stays NaN)
}
// atan(t + tl) for t >= 0 (inf and NaN too), tl a rounding error beside t, less its range's
// multiple of pi/4: t itself up to 1/2, atan((t - 1) / (t + 1)) up to 2 (pi/4 more), atan(-1 / t)
// past 2 (pi/2 more); atan(u) = u + u^3 P(u^2) on |u| <= 1/2 (P from tools/fit_cpu_math.py).
EMBER_FN float ember_atan_reduced(float t, float tl) {
  bool mid = t > 0.5f, far = t > 2.0f;
  float num = far ? -1.0f : (mid ? t - 1.0f : t), den = far ? t : (mid ? t + 1.0f : 1.0f);
  float u = num / den;
  // between 1/2 and 2, u's rounding and t + 1's (e, exactly: Sterbenz twice) beside it:
  // num / (den + e) = u + (num - u den - u e) / den to first order; tl enters times du/dt
  float e = t - (den - 1.0f);
  float lo = mid && !far ? (std::fma(-u, den, num) - u * e) / den + tl * (0.5f * (1.0f - u) * (1.0f - u)) : tl;
  float z = u * u;
  float p = std::fma(std::fma(std::fma(std::fma(-5.1410801709e-02f, z, 1.0166058689e-01f), z, -1.4176508784e-01f),
                              z, 1.9994376600e-01f), z, -3.3333238959e-01f);
  return std::fma(u * z, p, u) + lo;
}
// n pi/4 + v, one rounding: pi/4 in two parts
EMBER_FN float ember_add_quarter_pis(float n, float v) {
  return std::fma(n, 7.8539818525e-01f, std::fma(n, -2.1855694143e-08f, v));
}
EMBER_FN float ember_atan(float x) {
  float t = std::fabs(x);
  float n = t > 2.0f ? 2.0f : (t > 0.5f ? 1.0f : 0.0f);
  return std::copysign(ember_add_quarter_pis(n, ember_atan_reduced(t, 0.0f)), x);
}
// atan2(y, x) = n pi/4 + s atan(t), t = min(|x|, |y|) / max(|x|, |y|) in [0, 1]: with |y| > |x|
// (swap) the angle is pi/2 - atan(t), for x < 0 (its sign bit) pi less the angle; the sign is y's.
// Both 0: t = 0 (so +-0 and +-pi by x's sign), both infinite: t = 1 (+-pi/4, +-3 pi/4).
EMBER_FN float ember_atan2(float y, float x) {
  float ax = std::fabs(x), ay = std::fabs(y);
  bool swap = ay > ax, neg = std::signbit(x);
  float num = swap ? ax : ay, den = swap ? ay : ax;
  float scale = den < 0x1p-100f ? 0x1p64f : 1.0f;  // (so that t's rounding is not subnormal)
  num *= scale; den *= scale;
  float t = num / den;
  float tl = std::fma(-t, den, num) / den;  // t's rounding
  bool ends = den == 0.0f || num == INFINITY;
  t = den == 0.0f ? 0.0f : t;
  t = num == INFINITY ? 1.0f : t;
  tl = ends || den == INFINITY ? 0.0f : tl;
  float sign = swap != neg ? -1.0f : 1.0f;
  float n = (neg ? 4.0f : 0.0f) + (swap ? (neg ? -2.0f : 2.0f) : 0.0f) + (t > 0.5f ? sign : 0.0f);
  float r = std::copysign(ember_add_quarter_pis(n, sign * ember_atan_reduced(t, tl)), y);
  return (x != x || y != y) ? x + y : r;
}
// asin and acos: up to |x| = 1/2 asin(x) = x + x^3 P(x^2) (P from tools/fit_cpu_math.py); past it
// asin(|x|) = pi/2 - 2 asin(w), w = sqrt(q), q = (1 - |x|) / 2 (exact), and w's rounding c
// (q - w^2 exactly, from an fma) carried beside it. pi/2 and pi in two parts; |x| > 1 gives NaN
// through the root.
EMBER_FN float ember_asin_poly(float v, float q) {  // v^3 P(q), q = v^2
  float p = std::fma(std::fma(std::fma(std::fma(4.1861694306e-02f, q, 2.4373147637e-02f), q, 4.5427665114e-02f),
                              q, 7.4956730008e-02f), q, 1.6666741669e-01f);
  return v * q * p;
}
EMBER_FN float ember_asin_root(float a, float& t) {  // w = sqrt((1 - a) / 2), and t = asin(w) - w
  float q = 0.5f * (1.0f - a), w = std::sqrt(q);
  t = (w > 0.0f ? std::fma(-w, w, q) / (w + w) : 0.0f) + ember_asin_poly(w, q);
  return w;
}
EMBER_FN float ember_asin(float x) {
  float a = std::fabs(x), t;
  float w = ember_asin_root(a, t);
  float past = 1.5707963705e+00f - (2.0f * w - (-4.3711388287e-08f - 2.0f * t));
  return std::copysign(a <= 0.5f ? a + ember_asin_poly(a, a * a) : past, x);
}
// acos(x) = pi/2 - asin(x) up to |x| = 1/2; past it 2 asin(w) for x > 0, pi - 2 asin(w) for x < 0
EMBER_FN float ember_acos(float x) {
  float a = std::fabs(x), t;
  float w = ember_asin_root(a, t);
  float mid = 1.5707963705e+00f - (x - (-4.3711388287e-08f - ember_asin_poly(x, x * x)));
  float past = x > 0.0f ? 2.0f * (w + t) : 3.1415927410e+00f - (2.0f * w + (2.0f * t - -8.7422776573e-08f));
  return a <= 0.5f ? mid : past;
}
// pow(x, y) whose result is rounded to float32 or narrower: a float32 pow (bfloat16's and float16's
// too), and eager's float32 x ** scalar, which it computes in double. log|x| and exp in double,
// to within 1e-13 relative: the rounding to float32 is then right but where the exact value lies
// within a millionth of an ulp of a tie. The signs and ends are C's: x to the power 0 and 1 to
// any power are 1; a negative x (-0 and -inf too) to an odd integer power is negative, a finite
// negative x to a non-integer power NaN. |y| >= 2^53 and infinities count as even integers.
EMBER_FN double ember_bits_f64(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }
EMBER_FN uint64_t ember_f64_bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
EMBER_FN double ember_pow_narrow(double x, double y) {
  double ax = std::fabs(x);
  // log|x|: |x| = 2^k m, m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m - 1) / (m + 1),
  // |s| <= 0.1716: the series to s^15 (the rest < 2e-14 relative)
  bool tiny = ax < 0x1p-1022;  // (float32 values never are; a double narrowed after may be)
  uint64_t ix = ember_f64_bits(tiny ? ax * 0x1p54 : ax) + (0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull);
  double k = (double)((int64_t)(ix >> 52) - (tiny ? 1077 : 1023));
  double m = ember_bits_f64((ix & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull);
  double s = (m - 1.0) / (m + 1.0), z = s * s;
  double p = 2.0 / 15;
  p = std::fma(p, z, 2.0 / 13);
  p = std::fma(p, z, 2.0 / 11);
  p = std::fma(p, z, 2.0 / 9);
  p = std::fma(p, z, 2.0 / 7);
  p = std::fma(p, z, 2.0 / 5);
  p = std::fma(p, z, 2.0 / 3);
  double l = std::fma(k, 0.6931471805599453, std::fma(s * z, p, 2.0 * s));
  l = ax == 0.0 ? -INFINITY : (ax == INFINITY ? INFINITY : l);
  // exp(y l), y l clamped to [-200, 200] (2^-288 and 2^288 round to float32's 0 and inf):
  // n ln2 + r with |r| <= ln2 / 2 (ln2 in two parts), and the Taylor series to r^11
  double t = y * l;
  t = t < -200.0 ? -200.0 : (t > 200.0 ? 200.0 : t);
  double n = std::nearbyint(t * 1.4426950408889634);
  double r = std::fma(-n, 1.9082149292705877e-10, std::fma(-n, 6.9314718036912382e-01, t));
  double e = 1.0 / 39916800;
  e = std::fma(e, r, 1.0 / 3628800);
  e = std::fma(e, r, 1.0 / 362880);
  e = std::fma(e, r, 1.0 / 40320);
  e = std::fma(e, r, 1.0 / 5040);
  e = std::fma(e, r, 1.0 / 720);
  e = std::fma(e, r, 1.0 / 120);
  e = std::fma(e, r, 1.0 / 24);
  e = std::fma(e, r, 1.0 / 6);
  e = std::fma(e, r, 1.0 / 2);
  e = std::fma(e, r, 1.0);
  e = std::fma(e, r, 1.0);
  double v = e * ember_bits_f64((uint64_t)((int64_t)n + 1023) << 52);
  // (x's sign by copysign, the tests joined by &: with signbit and && GCC left a loop with a
  // varying y scalar)
  double ty = std::trunc(y), hy = 0.5 * y;
  v = (y == ty) & (hy != std::trunc(hy)) ? v * std::copysign(1.0, x) : v;
  v = (x < 0.0) & (x > -INFINITY) & (y != ty) ? NAN : v;
  v = x != x || y != y ? x + y : v;
  return x == 1.0 || y == 0.0 || (x == -1.0 && std::fabs(y) == INFINITY) ? 1.0 : v;
}
// sin, cos and tan for float32 without libm calls, on every float (huge ones too): |x| (2/pi) +
// turn = 2m + t, |t| <= 1 (plus its rounding), in double (Payne-Hanek): |x| = k 2^(e - 150), k an
// integer below 2^24, and bits of 2/pi of weight 2^-j, j <= e - 152, give multiples of 4, so only
// the 84 bits from j = s = max(1, e - 151) on count. Shifts cut them from 2/pi's words into three
// 28-bit parts, so |x| times each is exact (|x| scaled by 2^(1 - s) first, exactly);
// t = ((p0 - 2m) + p1) + p2 rounds once relative to itself, however close x lies to a multiple of
// pi/2 (what the 84 bits leave out is below 2^-59). Then sin(t pi/2) by its Taylor series in
// double (to r^15: < 1e-11 relative) and one rounding.
// Max error over all 2^32 inputs: 0.500 ulp each (tools/check_cpu_math.py sin cos tan).
EMBER_FN double ember_half_turns_of(double a, double c0, double c1, double c2, double turn, int32_t& m_odd) {
  double p0 = a * c0 + turn, p1 = a * c1, p2 = a * c2;  // (p0 exact: below 2^26)
  double m = std::nearbyint((p0 + p1) * 0.5);
  m_odd = (int32_t)m & 1;
  return ((p0 - 2.0 * m) + p1) + p2;
}
// |x| scaled by 2^(1 - s), exactly, and the three parts of 2/pi from bit s on (near: s = 1, for
// |x| < 2^26, constants; codegen/cpp_pointwise.py's loops use it where every argument is below
// 2^26: the shifts and selects take half of sin's time)
EMBER_FN double ember_half_turn_parts(float x, bool near, double& c0, double& c1, double& c2) {
  if (near) {
    c0 = NEAR_C0; c1 = NEAR_C1; c2 = NEAR_C2;
    return std::fabs((double)x);
  }
  int32_t e = (int32_t)((ember_f32_bits(x) >> 23) & 0xffu);
  int32_t s1 = e > 152 ? e - 152 : 0;  // s - 1, up to 102: the window from word s1 / 32, bit s1 % 32
  int32_t off = s1 & 31;
  bool odd = ((s1 >> 5) & 1) != 0, upper = ((s1 >> 5) & 2) != 0;
PICKED_WORDS
  // (v >> 1) >> (31 - off) is v >> (32 - off), 0 at off = 0
  uint32_t u0 = (w0 << off) | ((w1 >> 1) >> (31 - off));
  uint32_t u1 = (w1 << off) | ((w2 >> 1) >> (31 - off));
  uint32_t u2 = (w2 << off) | ((w3 >> 1) >> (31 - off));
  c0 = (double)(int32_t)(u0 >> 4) * 0x1p-28;
  c1 = (double)(int32_t)(((u0 & 0xfu) << 24) | (u1 >> 8)) * 0x1p-56;
  c2 = (double)(int32_t)(((u1 & 0xffu) << 20) | (u2 >> 12)) * 0x1p-84;
  return std::fabs((double)x) * (double)ember_bits_f32((uint32_t)(127 - s1) << 23);
}
EMBER_FN double ember_sin_half_turns(double t) {  // sin(t pi/2), |t| <= 1
  double r = t * 1.5707963267948966, z = r * r;
  double p = std::fma(std::fma(std::fma(std::fma(std::fma(std::fma(-1.0 / 1307674368000, z, 1.0 / 6227020800), z,
                                                          -1.0 / 39916800), z, 1.0 / 362880), z, -1.0 / 5040),
                               z, 1.0 / 120), z, -1.0 / 6);
  return std::fma(r * z, p, r);
}
EMBER_FN float ember_nan_past(float x, float y) { return std::fabs(x) == INFINITY || x != x ? x - x : y; }
// sin(x) = sign(x) (-1)^m sin(t pi/2); cos(x) = sin(|x| + pi/2): a turn of 1. Each in two forms:
// every float, and |x| < 2^26 (_near), the same there.
// (near: a constant once inlined, so each form keeps one reduction)
EMBER_FN float ember_sin_of(float x, bool near) {
  int32_t m_odd;
  double c0, c1, c2, a = ember_half_turn_parts(x, near, c0, c1, c2);
  double v = ember_sin_half_turns(ember_half_turns_of(a, c0, c1, c2, 0.0, m_odd));
  return ember_nan_past(x, (float)(std::copysign(1.0, (double)x) * (m_odd ? -v : v)));
}
EMBER_FN float ember_cos_of(float x, bool near) {
  int32_t m_odd;
  double c0, c1, c2, a = ember_half_turn_parts(x, near, c0, c1, c2);
  double v = ember_sin_half_turns(ember_half_turns_of(a, c0, c1, c2, 1.0, m_odd));
  return ember_nan_past(x, (float)(m_odd ? -v : v));
}
// tan = sin / cos, each from its own turn (near a pole the cosine's t is small, and as exact
// relative to itself as sin's)
EMBER_FN float ember_tan_of(float x, bool near) {
  int32_t m_odd, n_odd;
  double c0, c1, c2, a = ember_half_turn_parts(x, near, c0, c1, c2);
  double s = ember_sin_half_turns(ember_half_turns_of(a, c0, c1, c2, 0.0, m_odd));
  double c = ember_sin_half_turns(ember_half_turns_of(a, c0, c1, c2, 1.0, n_odd));
  double v = s / c;
  return ember_nan_past(x, (float)(std::copysign(1.0, (double)x) * (m_odd != n_odd ? -v : v)));
}
EMBER_FN float ember_sin(float x) { return ember_sin_of(x, false); }
EMBER_FN float ember_cos(float x) { return ember_cos_of(x, false); }
EMBER_FN float ember_tan(float x) { return ember_tan_of(x, false); }
EMBER_FN float ember_sin_near(float x) { return ember_sin_of(x, true); }
EMBER_FN float ember_cos_near(float x) { return ember_cos_of(x, true); }
EMBER_FN float ember_tan_near(float x) { return ember_tan_of(x, true); }
// erf for float32 without libm calls (max error ~2.3 ulp); coefficients from tools/fit_erf.py.
EMBER_FN float ember_erf(float x) {
  float ax = x < 0.0f ? -x : x;
  float x2 = ax * ax;
  float p = 7.898210210e-05f;
  p = std::fma(p, x2, -8.024354130e-04f); p = std::fma(p, x2, 5.190053578e-03f); p = std::fma(p, x2, -2.685480854e-02f);
  p = std::fma(p, x2, 1.128361243e-01f); p = std::fma(p, x2, -3.761262884e-01f); p = std::fma(p, x2, 1.128379167e+00f);
  float small = ax * p;
  float t = 1.0f / (ax > 1.0f ? ax : 1.0f);
  float r = -3.821760497e-02f;
  r = std::fma(r, t, 2.646626344e-01f); r = std::fma(r, t, -8.106041763e-01f); r = std::fma(r, t, 1.424004878e+00f);
  r = std::fma(r, t, -1.524053963e+00f); r = std::fma(r, t, 8.994859762e-01f); r = std::fma(r, t, -6.926850943e-02f);
  r = std::fma(r, t, -2.851863083e-01f); r = std::fma(r, t, 3.015458196e-03f); r = std::fma(r, t, 5.637192283e-01f);
  r = std::fma(r, t, 2.596134788e-05f);
  float large = std::fma(-ember_exp(-x2), r, 1.0f);
  float y = ax < 1.0f ? small : (ax < 4.0f ? large : 1.0f);
  y = x < 0.0f ? -y : y;
  return x != x ? x : y;
}
EMBER_FN float ember_sigmoid(float x) { return 1.0f / (1.0f + ember_exp(-x)); }
EMBER_FN double ember_sigmoid(double x) { return 1.0 / (1.0 + ember_exp_f64(-x)); }
EMBER_FN float ember_tanh(float x) {
  // tanh(x) = 1 - 2 / (exp(2x) + 1) cancels for small |x| (thousands of ulp at 5e-4): below
  // 0.55 the odd Taylor series to x^15 instead (within 2 ulp there; its next term is < 5e-8).
  float ax = x < 0.0f ? -x : x;
  float z = ax * ax;
  float p = -0.0014558343682438135f;
  p = std::fma(p, z, 0.0035921279340982437f);
  p = std::fma(p, z, -0.0088632358238101f);
  p = std::fma(p, z, 0.021869488060474396f);
  p = std::fma(p, z, -0.05396825447678566f);
  p = std::fma(p, z, 0.13333334028720856f);
  p = std::fma(p, z, -0.3333333432674408f);
  float small = std::fma(ax * z, p, ax);
  float t = 1.0f - 2.0f / (ember_exp(2.0f * ax) + 1.0f);
  t = ax < 0.55f ? small : t;
  t = std::copysign(t, x);  // (tanh(-0) is -0)
  return x != x ? x : t;
}

""".replace("PICKED_WORDS", _picked_words())
for _k in range(3):
    MATH = MATH.replace(f"NEAR_C{_k}", _near_part(_k))
