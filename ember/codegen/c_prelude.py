"""C helpers every C-style translation unit includes (CPU C++ and CUDA C++)."""

# Helpers every C-style backend includes. EMBER_FN is 'static inline' on the CPU and
# '__device__ __forceinline__' in CUDA.
COMMON_PRELUDE = r"""
template <typename T> struct EmberArg { T v; int64_t i; };
// Integer bounds, chosen by overload on a dummy argument (works in host and device code).
#define EMBER_LIMITS(T, LO, HI) \
  EMBER_FN T ember_lowest(T) { return LO; } \
  EMBER_FN T ember_highest(T) { return HI; }
EMBER_LIMITS(int8_t, INT8_MIN, INT8_MAX)
EMBER_LIMITS(int16_t, INT16_MIN, INT16_MAX)
EMBER_LIMITS(int32_t, INT32_MIN, INT32_MAX)
EMBER_LIMITS(int64_t, INT64_MIN, INT64_MAX)
EMBER_LIMITS(uint8_t, 0, UINT8_MAX)

// torch.maximum / torch.minimum: NaN wins.
// Bitwise | rather than ||: no branch, so loops using them still vectorize.
#if __CUDA_ARCH__ >= 800  // one instruction on the GPU (a NaN result is the canonical NaN)
EMBER_FN float ember_max(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
EMBER_FN float ember_min(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#elif defined(__CUDACC__)
EMBER_FN float ember_max(float a, float b) { return ((a > b) | (a != a)) ? a : b; }
EMBER_FN float ember_min(float a, float b) { return ((a < b) | (a != a)) ? a : b; }
#else  // eager's CPU kernels keep the first of equal values: relu(-0.0) and max([-0.0, 0.0]) are -0.0
EMBER_FN float ember_max(float a, float b) { return ((a >= b) | (a != a)) ? a : b; }
EMBER_FN float ember_min(float a, float b) { return ((a <= b) | (a != a)) ? a : b; }
#endif
#if defined(__CUDACC__)
EMBER_FN double ember_max(double a, double b) { return ((a > b) | (a != a)) ? a : b; }
EMBER_FN double ember_min(double a, double b) { return ((a < b) | (a != a)) ? a : b; }
#else
EMBER_FN double ember_max(double a, double b) { return ((a >= b) | (a != a)) ? a : b; }
EMBER_FN double ember_min(double a, double b) { return ((a <= b) | (a != a)) ? a : b; }
#endif
template <typename T> EMBER_FN T ember_max(T a, T b) { return a > b ? a : b; }
template <typename T> EMBER_FN T ember_min(T a, T b) { return a < b ? a : b; }
EMBER_FN int64_t ember_imax(int64_t a, int64_t b) { return a > b ? a : b; }
EMBER_FN int64_t ember_imin(int64_t a, int64_t b) { return a < b ? a : b; }
// Python's // and % of size expressions that may be negative (C's truncate)
EMBER_FN int64_t ember_ifloordiv(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
EMBER_FN int64_t ember_imod(int64_t a, int64_t b) {
  if (b == 0) return 0;
  int64_t m = a % b;
  return (m != 0 && ((m < 0) != (b < 0))) ? m + b : m;
}

// argmax/argmin: NaN counts as the largest (and smallest) value; ties keep the first index.
template <typename T> EMBER_FN void ember_argmax_step(EmberArg<T>& a, T v, int64_t i) {
  bool take = (v > a.v) || (v != v && a.v == a.v) || ((v == a.v || (v != v && a.v != a.v)) && i < a.i);
  if (take) { a.v = v; a.i = i; }
}
template <typename T> EMBER_FN void ember_argmin_step(EmberArg<T>& a, T v, int64_t i) {
  bool take = (v < a.v) || (v != v && a.v == a.v) || ((v == a.v || (v != v && a.v != a.v)) && i < a.i);
  if (take) { a.v = v; a.i = i; }
}

// (|INT_MIN| is INT_MIN, as in eager: negated through unsigned, since a signed overflow let
// compilers assume abs(x) >= 0)
template <typename T> EMBER_FN T ember_abs(T a) { return a < 0 ? (T)(0 - (uint64_t)(int64_t)a) : a; }
#if defined(__CUDA_ARCH__)
// (in PTX, not C: NVVM turns the C above into abs.s32/abs.s64, and ptxas takes their result as
// >= 0, so floor division of |INT_MIN| dropped its rounding down; neg + selp keep the sign)
EMBER_FN int32_t ember_abs(int32_t a) {
  int32_t r;
  asm("{ .reg .pred n; setp.lt.s32 n, %1, 0; neg.s32 %0, %1; selp.b32 %0, %0, %1, n; }" : "=r"(r) : "r"(a));
  return r;
}
EMBER_FN int64_t ember_abs(int64_t a) {
  int64_t r;
  asm("{ .reg .pred n; setp.lt.s64 n, %1, 0; neg.s64 %0, %1; selp.b64 %0, %0, %1, n; }" : "=l"(r) : "l"(a));
  return r;
}
#endif
// int16 results of arithmetic, computed in int (a division helper's int64 converts to its low
// 32 bits) and cut back here. On the GPU through PTX NVVM cannot see into: it turned int16
// negation (and 0 - x, x * -1, x / -1) into neg.s16 or abs.s16, and ptxas takes their results
// as already sign-extended in its 32-bit registers, so -(-32768) and |-32768| reached a widening
// or a comparison as +32768 (int16 (-x) // -3 at -32768 was -10923 on an H100, eager's 10922;
// abs(-32768) % 5 was 3). bfe.s32 extends the sign of bit 15 (one SGXT). int8 needs none: NVVM
// widens int8 arithmetic to 16 bits and sign-extends from bit 7 itself.
#if defined(__CUDA_ARCH__)
EMBER_FN int16_t ember_wrap_i16(int32_t w) {
  int32_t r;
  asm("bfe.s32 %0, %1, 0, 16;" : "=r"(r) : "r"(w));
  return (int16_t)r;
}
#else
EMBER_FN int16_t ember_wrap_i16(int32_t w) { return (int16_t)w; }
#endif
EMBER_FN int16_t ember_abs(int16_t a) { const int32_t w = a; return ember_wrap_i16(w < 0 ? -w : w); }
EMBER_FN int8_t ember_abs(int8_t a) { const int32_t w = a; return (int8_t)(w < 0 ? -w : w); }
EMBER_FN uint8_t ember_abs(uint8_t a) { return a; }
EMBER_FN bool ember_abs(bool a) { return a; }
// (-0.0 and a NaN of either sign lose their sign bit, as fabs: eager's abs)
EMBER_FN float ember_abs(float a) { return a < 0.0f ? -a : (a == 0.0f ? 0.0f : (a == a ? a : (float)NAN)); }
EMBER_FN double ember_abs(double a) { return a < 0.0 ? -a : (a == 0.0 ? 0.0 : (a == a ? a : (double)NAN)); }
// (NaN -> 0, as eager's sign)
template <typename T> EMBER_FN T ember_sign(T a) { return (T)((T(0) < a) - (a < T(0))); }
EMBER_FN bool ember_isinf(float a) { return a == INFINITY || a == -INFINITY; }
EMBER_FN bool ember_isinf(double a) { return a == INFINITY || a == -INFINITY; }
// (the sign bit itself: signbit(-0.0) and of a negative NaN are true, as eager's)
EMBER_FN bool ember_signbit(float a) { return copysignf(1.0f, a) < 0.0f; }
EMBER_FN bool ember_signbit(double a) { return copysign(1.0, a) < 0.0; }
// ATen's calc_gcd step for step in the element type T: |INT_MIN| stays INT_MIN (ember_abs), so
// gcd(INT_MIN, 0) is INT_MIN, and 8/16-bit remainders are taken in int and truncated back.
// b % a cannot be INT_MIN % -1: after the first step b is a remainder, never INT_MIN.
template <typename T> EMBER_FN T ember_gcd(T a, T b) {
  a = ember_abs(a);
  b = ember_abs(b);
  while (a != 0) { T c = a; a = (T)(b % a); b = c; }
  return b;
}
// ATen's lcm: |a / g * b| in C's promoted type W (int for 8/16-bit T: exact there, then
// truncated; int32 and int64 wrap), 0 where g is. (g is -1 for gcd(INT_MIN, INT_MAX), where
// eager's INT_MIN / -1 traps, SIGFPE: here it wraps.)
template <typename T> EMBER_FN T ember_lcm(T a, T b) {
  typedef decltype(+a) W;
  W g = (W)ember_gcd(a, b);
  if (g == 0) return (T)0;
  W q = g == -1 ? (W)(0 - (uint64_t)(int64_t)a) : (W)((W)a / g);
  W p = (W)((uint64_t)(int64_t)q * (uint64_t)(int64_t)(W)b);
  return (T)ember_abs(p);
}
EMBER_FN float ember_rsqrt(float a) { return 1.0f / sqrtf(a); }
EMBER_FN double ember_rsqrt(double a) { return 1.0 / sqrt(a); }

// Python-style rounding division and remainder, as torch.div(rounding_mode=...) and
// torch.remainder; integer division by zero sets *err (eager raises ZeroDivisionError).
template <typename F> EMBER_FN F ember_floordiv_f(F a, F b) {
  if (b == 0) return a / b;
  F mod = fmod(a, b);
  F div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
  F fl;
  if (div != 0) { fl = floor(div); if (div - fl > (F)0.5) fl += 1; }
  else { fl = copysign((F)0, a / b); }
  return fl;
}
EMBER_FN float ember_floordiv(float a, float b) { return ember_floordiv_f<float>(a, b); }
EMBER_FN double ember_floordiv(double a, double b) { return ember_floordiv_f<double>(a, b); }
EMBER_FN float ember_truncdiv(float a, float b) { return truncf(a / b); }
EMBER_FN double ember_truncdiv(double a, double b) { return trunc(a / b); }
template <typename F> EMBER_FN F ember_mod_f(F a, F b) {
  F m = fmod(a, b);
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
EMBER_FN float ember_mod(float a, float b) { return ember_mod_f<float>(a, b); }
EMBER_FN double ember_mod(double a, double b) { return ember_mod_f<double>(a, b); }
// Integer division, as eager's: int64 values divide in int64, narrower ones in int32 (cstyle.py),
// since a 64-bit division is a software routine on GPUs (int16 // -3 took a quarter longer) and
// a slower instruction on x86. U, I's unsigned twin, wraps the negation of I's minimum.
template <typename I, typename U> EMBER_FN I ember_truncdiv_i(I a, I b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return (I)(0 - (U)a);
  return a / b;
}
template <typename I, typename U> EMBER_FN I ember_floordiv_i(I a, I b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return (I)(0 - (U)a);
  I q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
template <typename I> EMBER_FN I ember_fmod_i(I a, I b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  return a % b;
}
template <typename I> EMBER_FN I ember_mod_i(I a, I b, int32_t* err) {
  if (b == 0) { *err = 1; return 0; }
  if (b == -1) return 0;
  I m = a % b;
  if (m != 0 && ((b < 0) != (m < 0))) m += b;
  return m;
}
#define EMBER_INT_DIVISION(I, U) \
  EMBER_FN I ember_truncdiv(I a, I b, int32_t* err) { return ember_truncdiv_i<I, U>(a, b, err); } \
  EMBER_FN I ember_floordiv(I a, I b, int32_t* err) { return ember_floordiv_i<I, U>(a, b, err); } \
  EMBER_FN I ember_fmod(I a, I b, int32_t* err) { return ember_fmod_i<I>(a, b, err); } \
  EMBER_FN I ember_mod(I a, I b, int32_t* err) { return ember_mod_i<I>(a, b, err); }
EMBER_INT_DIVISION(int64_t, uint64_t)
EMBER_INT_DIVISION(int32_t, uint32_t)
#undef EMBER_INT_DIVISION
// A gather's or an indexing's index: eager raises for one out of range; kernels flag it (code 2
// or 3, which the host turns into eager's exception) and stay in bounds. The code carries the
// check's place in the program above its low byte (cstyle.py), and the smallest flagged code
// stays: eager raises at the first op that fails, where a fused kernel meets its elements in
// another order (x[i] then x.gather(0, j) with a bad j[0] and a bad i[3] raised gather's
// RuntimeError, not indexing's IndexError; a weighted cross-entropy's target is checked by
// nll_loss's IndexError before the weight's gather).
EMBER_FN int64_t ember_check_index(int64_t i, int64_t n, int32_t code, int32_t* err) {
  bool bad = (i < 0) | (i >= n);
  if (bad && (*err == 0 || code < *err)) *err = code;
  return bad ? 0 : i;
}
EMBER_FN int64_t ember_check_index_if(bool used, int64_t i, int64_t n, int32_t code, int32_t* err) {
  bool bad = (i < 0) | (i >= n);
  if (bad && used && (*err == 0 || code < *err)) *err = code;
  return bad ? 0 : i;
}
// searchsorted in a sorted sequence of n elements, stride apart: how many are < v (<= v when
// right), compared as eager compares (!(x >= v), !(x > v)): a NaN v sorts after every element.
// Eager's binary search, probe for probe: a NaN bound (torch.sort puts them last) passes that
// comparison too, so past the bounds below v the answer depends on which bounds are read.
// Each step halves a size every lane shares (it bounds every lane's range), so all lanes take
// the same number of steps.
template <typename T, typename V>
EMBER_FN int64_t ember_search(const T* seq, int64_t n, int64_t stride, V v, bool right) {
  int64_t lo = 0, hi = n;
  for (int64_t size = n; size > 0; size >>= 1) {
    if (lo < hi) {
      int64_t mid = lo + ((hi - lo) >> 1);
      T x = seq[mid * stride];
      if (right ? !(x > v) : !(x >= v)) lo = mid + 1; else hi = mid;
    }
  }
  return lo;
}
// The same answer, starting from a hint (the previous answer of this thread). Any hint is safe
// in a sequence whose answers are monotone: it is used only when every element before it is
// below v; a few linear steps find the answer for sorted queries, else a binary search of the
// rest does. A sequence ending in NaN (x != x) is not monotone: eager's full search answers.
template <typename T, typename V>
EMBER_FN int64_t ember_search_from(const T* seq, int64_t n, int64_t stride, V v, bool right, int64_t* hint) {
  if (n > 0 && !(seq[(n - 1) * stride] == seq[(n - 1) * stride])) return ember_search(seq, n, stride, v, right);
  int64_t lo = *hint;
  if (lo < 0 || lo > n) lo = 0;
  if (lo > 0) {
    T x = seq[(lo - 1) * stride];
    if (!(right ? !(x > v) : !(x >= v))) lo = 0;
  }
  for (int step = 0; lo < n; ++step, ++lo) {
    T x = seq[lo * stride];
    if (!(right ? !(x > v) : !(x >= v))) break;
    if (step == 8) { lo += ember_search(seq + lo * stride, n - lo, stride, v, right); break; }
  }
  *hint = lo;
  return lo;
}
EMBER_FN int64_t ember_clamp_index(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
EMBER_FN int64_t ember_ipow(int64_t base, int64_t exp) {
  if (exp < 0) return base == 1 ? 1 : (base == -1 ? ((exp & 1) ? -1 : 1) : 0);
  int64_t result = 1;
  while (exp) { if (exp & 1) result = (int64_t)((uint64_t)result * (uint64_t)base);
                base = (int64_t)((uint64_t)base * (uint64_t)base); exp >>= 1; }
  return result;
}
// The same algorithms with every intermediate rounded to a 16-bit float, as eager computes them
// on BFloat16/Half values. R is the backend's round-trip (ember_round_bf16 / ember_round_f16).
#define EMBER_ROUNDED_DIVISION(SUFFIX, R) \
  EMBER_FN float ember_floordiv_##SUFFIX(float a, float b) { \
    if (b == 0) return R(a / b); \
    float mod = R(fmodf(a, b)); \
    float div = R(R(a - mod) / b); \
    if (mod != 0 && ((b < 0) != (mod < 0))) div = R(div - 1); \
    float fl; \
    if (div != 0) { fl = floorf(div); if (R(div - fl) > 0.5f) fl = R(fl + 1); } \
    else { fl = copysignf(0.0f, R(a / b)); } \
    return fl; \
  } \
  EMBER_FN float ember_truncdiv_##SUFFIX(float a, float b) { return truncf(R(a / b)); } \
  EMBER_FN float ember_mod_##SUFFIX(float a, float b) { \
    float m = R(fmodf(a, b)); \
    if (m != 0 && ((b < 0) != (m < 0))) m = R(m + b); \
    return m; \
  }

template <typename T> EMBER_FN T ember_shl(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)0 : (T)((uint64_t)a << b);
}
template <typename T> EMBER_FN T ember_shr(T a, T b) {
  return (b < 0 || b >= (T)(8 * sizeof(T))) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b);
}
"""

# 1 + erf(z) in float32 (passes/erf.py): R of log2(erfc(t)) = t * R(t) on [0, 4], highest degree
# first, from tools/fit_one_plus_erf.py. runtime/triton_helpers.py (one_plus_erf) spells the same
# numbers; a test holds the two to each other.
ONE_PLUS_ERF_POLY = (
    1.1539782462932635e-07, -3.0300464004540117e-06, 3.537570228218101e-05, -0.00023980667174328119,
    0.0010127660352736712, -0.00242486409842968, 0.00010724039748311043, 0.02779647707939148,
    -0.14836527407169342, -0.918427050113678, -1.6279085874557495,
)
ONE_PLUS_ERF_CUTOFF = 4.0


def one_plus_erf_source(fma: str, exp2: str) -> str:
    """C source of ``ember_one_plus_erf(float)``, with the backend's spellings of a float fused
    multiply-add (``fma``, a function name) and of 2^x (``exp2``, a format string)."""
    steps = "\n".join(f"  r = {fma}(r, t, {c!r}f);" for c in ONE_PLUS_ERF_POLY[1:])
    return f"""
// 1 + erf(z) for float32 from one polynomial (passes/erf.py): erfc(|z|) = 2^(t R(t)), accurate
// where eager's 1 + erf cancels (z < -1); 0 past |z| = {ONE_PLUS_ERF_CUTOFF}, where erf is +-1 in float32.
EMBER_FN float ember_one_plus_erf(float z) {{
  float t = z < 0.0f ? -z : z;
  float r = {ONE_PLUS_ERF_POLY[0]!r}f;
{steps}
  float e = {exp2.format("t * r")};
  e = t > {ONE_PLUS_ERF_CUTOFF!r}f ? 0.0f : e;
  return z < 0.0f ? e : 2.0f - e;
}}
"""
