"""Check the CPU backend's float32 exp (``ember_exp`` in codegen/cpp_prelude.py) on every one of
the 2^32 float32 inputs, built with ember's own C++ flags: its error in ulps against the float64
exp rounded to float32, and its ends (0 below the smallest subnormal's half, inf past
float32's largest value, NaN for NaN). Run it after any change to ember_exp; about 30 s on 2 cores.
It exits 1 where the error passes LIMIT_ULP or an end is wrong.

    python tools/check_cpu_exp.py
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
    for (int lo = 0; lo < 65536; ++lo) ys[lo] = ember_exp(xs[lo]);
    double here = 0; float here_x = 0;
    for (int lo = 0; lo < 65536; ++lo) {
      float x = xs[lo], y = ys[lo];
      if (x != x) { nans += y == y; continue; }
      double exact = std::exp((double)x);
      float nearest = (float)exact;
      if (std::isinf(nearest) || nearest == 0.0f) { ends += y != nearest; continue; }
      // one ulp of the float32 nearest the exact value (the smallest subnormal's below 2^-126)
      int e; std::frexp(std::max((double)nearest, 0x1p-126), &e);
      double err = std::fabs((double)y - exact) / std::ldexp(1.0, e - 24);
      worse += err > 1.0;
      if (err > here) { here = err; here_x = x; }
    }
    #pragma omp critical
    if (here > max_ulp) { max_ulp = here; worst = here_x; }
  }
  std::printf("max error %.3f ulp (at x = %a); %ld inputs past 1 ulp; %ld wrong ends; %ld NaNs not NaN\n",
              max_ulp, worst, worse, ends, nans);
  return max_ulp > LIMIT_ULP || ends || nans;
}
"""
LIMIT_ULP = 1.1  # "max error ~1 ulp" (cpp_prelude.py): 99 inputs of 2^32 are past 1, none past 1.03


def main() -> int:
    compiler = find_compiler(config.cxx)
    with tempfile.TemporaryDirectory() as tmp:
        source, binary = Path(tmp) / "check_exp.cpp", Path(tmp) / "check_exp"
        source.write_text(PRELUDE + f"#define LIMIT_ULP {LIMIT_ULP}\n" + CHECK)
        flags = [f for f in BUILD_FLAGS if f not in ("-shared", "-fPIC")]
        subprocess.run([compiler, *config.cxx_flags, *flags, str(source), "-o", str(binary)], check=True)
        return subprocess.run([str(binary)]).returncode


if __name__ == "__main__":
    sys.exit(main())
