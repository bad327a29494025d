"""Check the CPU backend's float32 exp, expm1 and log1p (``ember_exp``, ``ember_expm1``,
``ember_log1p`` in codegen/cpp_prelude.py) on every one of the 2^32 float32 inputs, built with
ember's own C++ flags and vectorized as kernels use them: the error in ulps against the float64
function, and the ends exactly (where the float32 nearest the exact value is 0, inf or the
input is infinite: the same value and sign; NaN where the exact value is NaN). Run it after
any change to them; about 30 s a function on 2 cores. It exits 1 where an error passes the
function's limit or an end is wrong.

    python tools/check_cpu_math.py [exp expm1 log1p]
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
int main() {
  long worse = 0, ends = 0, nans = 0; double max_ulp = 0; float worst = 0;
  #pragma omp parallel for schedule(dynamic, 64) reduction(+:worse, ends, nans)
  for (int64_t hi = 0; hi < 65536; ++hi) {
    float xs[65536], ys[65536];
    for (int lo = 0; lo < 65536; ++lo) xs[lo] = ember_bits_f32((uint32_t)(hi << 16 | lo));
    #pragma omp simd
    for (int lo = 0; lo < 65536; ++lo) ys[lo] = FUNCTION(xs[lo]);
    double here = 0; float here_x = 0;
    for (int lo = 0; lo < 65536; ++lo) {
      float x = xs[lo], y = ys[lo];
      double exact = REFERENCE((double)x);
      if (exact != exact) { nans += y == y; continue; }
      float nearest = (float)exact;
      if (std::isinf(nearest) || nearest == 0.0f || std::isinf(x)) {
        ends += y != nearest || std::signbit(y) != std::signbit(nearest);
        continue;
      }
      // one ulp of the float32 nearest the exact value (the smallest subnormal's below 2^-126)
      int e; std::frexp(std::max(std::fabs((double)nearest), 0x1p-126), &e);
      double err = std::fabs((double)y - exact) / std::ldexp(1.0, e - 24);
      worse += err > 1.0;
      if (err > here) { here = err; here_x = x; }
    }
    #pragma omp critical
    if (here > max_ulp) { max_ulp = here; worst = here_x; }
  }
  std::printf("NAME: max error %.3f ulp (at x = %a); %ld inputs past 1 ulp; %ld wrong ends; %ld NaNs not NaN\n",
              max_ulp, worst, worse, ends, nans);
  return max_ulp > LIMIT_ULP || ends || nans;
}
"""
# function: (ember's, the float64 reference, the most ulps allowed). exp: "max error ~1 ulp"
# (99 inputs of 2^32 past 1, none past 1.03).
FUNCTIONS = {
    "exp": ("ember_exp", "std::exp", 1.1),
    "expm1": ("ember_expm1", "std::expm1", 1.35),  # 1.318 at most (99030 inputs past 1)
    "log1p": ("ember_log1p", "std::log1p", 0.9),  # 0.863 at most
}


def check(name: str) -> int:
    function, reference, limit = FUNCTIONS[name]
    compiler = find_compiler(config.cxx)
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / f"check_{name}.cpp", Path(tmp) / f"check_{name}"
        source.write_text(PRELUDE + CHECK.replace("FUNCTION", function).replace("REFERENCE", reference)
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
