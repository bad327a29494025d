// GCC 12.2 with -O3 -march=native (AVX-512, this project's CPU machines) miscompiles a gather whose
// 64-bit index is computed from a bool read as a byte: every lane reads x[0] (the vectorized loop
// reads stack bytes for the index). ember renders exactly this for
// `torch.softmax(x, -1)[(mask + 1).long()]` (CPU fuzz seed 11005, bench/RESULTS.md). Build and run:
//     g++ -O3 -march=native bench/gcc_bool_gather_probe.cpp -o /tmp/probe && /tmp/probe
// It prints "bad 62" where the bug is, "bad 0" where it is not. Seen fixed by: -mavx2 in place of
// -march=native, -fno-tree-loop-vectorize, -fno-tree-ch, a 32-bit index, reading the element as
// `bool` (m[o]) instead of as its byte, or no gather (storing the index itself).
#include <cstdint>
#include <cstdio>

__attribute__((noinline)) void kern(const bool* __restrict__ m, const float* __restrict__ x, float* __restrict__ out,
                                    int64_t n) {
  for (int64_t o = 0; o < n; ++o) {
    const bool v0 = (*(const uint8_t*)&m[o] != 0);
    const int64_t v1 = (v0 ? (int64_t)1 : (int64_t)0);
    const int64_t idx = v1 + 1;
    out[o] = x[idx];
  }
}

int main() {
  static bool m[64];
  static float x[8] = {0, 1, 2, 3}, out[64];
  for (int i = 0; i < 64; ++i) m[i] = i % 3 != 0;
  kern(m, x, out, 64);
  int bad = 0;
  for (int i = 0; i < 64; ++i) {
    const float want = x[m[i] ? 2 : 1];
    if (out[i] != want) {
      if (bad < 3) printf("%d: %g, want %g\n", i, out[i], want);
      ++bad;
    }
  }
  printf("bad %d\n", bad);
  return 0;
}
