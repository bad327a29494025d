"""Check the CPU backend's float32 math (codegen/cpp_math.py: ``ember_exp``, ``ember_log``,
``ember_atan2`` and the rest) on every one of the 2^32 float32 inputs, built with ember's own
C++ flags and vectorized as kernels use them: the error in ulps against the float64 function,
and the ends exactly (where the float32 nearest the exact value is 0 or inf, or an input is
infinite: the same value and sign; NaN where the exact value is NaN). atan2 and pow take 2^32
pairs: every combination of both operands' top 16 bits (sign, exponent, 7 mantissa bits), their
low bits mixed from the pair's index. Run it after any change; 30-60 s a function on 2 cores
(pow, in double, and sin, cos and tan, against glibc's slow double reduction: 2 minutes). It
exits 1 where an error passes the function's limit or an end is wrong.

    python tools/check_cpu_math.py [exp exp2 expm1 log1p log log2 log10 sinh cosh atan atan2 asin acos sin cos tan pow]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from ember.codegen.cpp_prelude import PRELUDE
from ember.config import config
from ember.runtime.cpp_build import BUILD_FLAGS, find_compiler

CHECK = r"""
#include <cstdio>
// the low 16 bits of a pair's operand (binary functions): a hash of its place
static inline uint32_t mix(uint32_t a, uint32_t b) {
  uint32_t h = (a * 0x9e3779b1u) ^ (b * 0x85ebca77u);
  h ^= h >> 15; h *= 0x2c1b3c6du; h ^= h >> 12;
  return h & 0xffffu;
}
int main() {
  long worse = 0, ends = 0, nans = 0; double max_ulp = 0; float worst = 0, worst_w = 0;
  #pragma omp parallel for schedule(dynamic, 64) reduction(+:worse, ends, nans)
  for (int64_t hi = 0; hi < 65536; ++hi) {
    float ws[65536], xs[65536], ys[65536];
    for (int lo = 0; lo < 65536; ++lo) {
      ws[lo] = ember_bits_f32((uint32_t)(hi << 16) | mix(hi, lo));
      xs[lo] = ember_bits_f32(ARITY == 1 ? (uint32_t)(hi << 16 | lo) : (uint32_t)lo << 16 | mix(lo, hi));
    }
    #pragma omp simd
    for (int lo = 0; lo < 65536; ++lo) ys[lo] = CALL;
    double here = 0; float here_x = 0, here_w = 0;
    for (int lo = 0; lo < 65536; ++lo) {
      float w = ws[lo], x = xs[lo], y = ys[lo];
      double exact = REFERENCE;
      if (exact != exact) { nans += y == y; continue; }
      float nearest = (float)exact;
      if (std::isinf(nearest) || nearest == 0.0f || std::isinf(x) || (ARITY == 2 && std::isinf(w))) {
        ends += y != nearest || std::signbit(y) != std::signbit(nearest);
        continue;
      }
      // one ulp of the float32 nearest the exact value (the smallest subnormal's below 2^-126)
      int e; std::frexp(std::max(std::fabs((double)nearest), 0x1p-126), &e);
      double err = std::fabs((double)y - exact) / std::ldexp(1.0, e - 24);
      worse += err > 1.0;
      if (err > here) { here = err; here_x = x; here_w = w; }
    }
    #pragma omp critical
    if (here > max_ulp) { max_ulp = here; worst = here_x; worst_w = here_w; }
  }
  if (ARITY == 1)
    std::printf("NAME: max error %.3f ulp (at x = %a); %ld inputs past 1 ulp; %ld wrong ends; %ld NaNs not NaN\n",
                max_ulp, worst, worse, ends, nans);
  else
    std::printf("NAME: max error %.3f ulp (at %a, %a); %ld pairs past 1 ulp; %ld wrong ends; %ld NaNs not NaN\n",
                max_ulp, worst_w, worst, worse, ends, nans);
  return max_ulp > LIMIT_ULP || ends || nans;
}
"""
# function: (ember's, the float64 reference, the most ulps allowed: each one's measured maximum,
# rounded up; "past 1" counts inputs of 2^32 beyond 1 ulp).
FUNCTIONS = {
    "exp": ("ember_exp", "std::exp", 1.1),  # 1.023 (99 past 1)
    "exp2": ("ember_exp2", "std::exp2", 0.9),  # 0.868
    "expm1": ("ember_expm1", "std::expm1", 1.35),  # 1.318 (99030 past 1)
    "log1p": ("ember_log1p", "std::log1p", 0.9),  # 0.863
    "log": ("ember_log", "std::log", 0.9),  # 0.843
    "log2": ("ember_log2", "std::log2", 0.9),  # 0.861
    "log10": ("ember_log10", "std::log10", 0.9),  # 0.828
    "sinh": ("ember_sinh", "std::sinh", 1.65),  # 1.619 (805384 past 1)
    "cosh": ("ember_cosh", "std::cosh", 1.5),  # 1.467 (463718 past 1)
    "atan": ("ember_atan", "std::atan", 1.4),  # 1.375 (76160 past 1)
    "atan2": ("ember_atan2", "std::atan2", 1.5),  # 1.478 (78016 pairs past 1)
    "asin": ("ember_asin", "std::asin", 1.25),  # 1.210 (48800 past 1)
    "acos": ("ember_acos", "std::acos", 0.8),  # 0.788
    "sin": ("ember_sin", "std::sin", 0.51),  # 0.500
    "cos": ("ember_cos", "std::cos", 0.51),  # 0.500
    "tan": ("ember_tan", "std::tan", 0.51),  # 0.500
    # float32 pow (x, y), computed in double and rounded once more
    "pow": ("(float)ember_pow_narrow", "std::pow", 0.5001),
}
BINARY = ("atan2", "pow")


def check(name: str) -> int:
    function, reference, limit = FUNCTIONS[name]
    arity = 2 if name in BINARY else 1
    call = f"{function}(ws[lo], xs[lo])" if arity == 2 else f"{function}(xs[lo])"
    exact = f"{reference}((double)w, (double)x)" if arity == 2 else f"{reference}((double)x)"
    compiler = find_compiler(config.cxx)
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / f"check_{name}.cpp", Path(tmp) / f"check_{name}"
        source.write_text(PRELUDE + CHECK.replace("CALL", call).replace("REFERENCE", exact).replace("ARITY", str(arity))
                          .replace("NAME", name).replace("LIMIT_ULP", str(limit)))
        flags = [f for f in BUILD_FLAGS if f not in ("-shared", "-fPIC")]
        subprocess.run([compiler, *config.cxx_flags, *flags, str(source), "-o", str(binary)], check=True)
        return subprocess.run([str(binary)]).returncode


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in FUNCTIONS]
    if unknown:
        print(f"unknown function(s) {unknown}; choose from {sorted(FUNCTIONS)}", file=sys.stderr)
        return 2
    return max(check(n) for n in names or list(FUNCTIONS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
