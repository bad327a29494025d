"""float16 row kernels on the CPU with and without rows converted once (codegen/cpp_staging.py:
converted_once), in one process: each variant compiled apart, rounds in random order, medians.

    python bench/half_rows.py [--variants new,off,shared,own] [--cases ln,sm,rms] [--sizes 1024,4096]

``off`` converts every loop's strips (as before the change), ``shared`` only rows every row
reads alike (weights), ``own`` only each row's own, ``new`` what the rule picks. Rows x columns
hold 4M elements (at least 64 rows).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ember  # noqa: E402
import ember.codegen.cpp as cpp  # noqa: E402
from ember.config import Config  # noqa: E402

RULE = cpp.converted_once
VARIANTS = {"new": RULE, "off": lambda r, k: ([], []), "shared": lambda r, k: (RULE(r, k)[0], []),
            "own": lambda r, k: ([], RULE(r, k)[1])}


def rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def softmax(x):
    return torch.softmax(x, -1)


CASES = {"rms": (rms_norm, 1), "ln": (layer_norm, 2), "sm": (softmax, 0)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variants", default="new,off")
    p.add_argument("--cases", default="ln,sm,rms")
    p.add_argument("--sizes", default="1024,4096,32768")
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    flags = Config().cxx_flags
    for n in (int(s) for s in a.sizes.split(",")):
        rows = max(64, (4 << 20) // n)
        for case in a.cases.split(","):
            fn, params = CASES[case]
            args = (torch.randn(rows, n, dtype=torch.float16),) + tuple(
                torch.randn(n, dtype=torch.float16) for _ in range(params))
            calls = {}
            for v in a.variants.split(","):
                cpp.converted_once = VARIANTS[v]
                # a code object of its own per variant (Dynamo caches by it), a build of its own
                # (a flag in the cache key)
                g = types.FunctionType(fn.__code__.replace(co_name=f"{case}_{v}_{n}"), fn.__globals__)
                calls[v] = ember.compile(g, options={"cxx_flags": flags + (f"-DEMBER_VARIANT_{v}",)})
                torch.testing.assert_close(calls[v](*args), fn(*args), rtol=2e-2, atol=2e-2)
            cpp.converted_once = RULE
            calls["eager"] = fn
            samples: dict[str, list[float]] = {k: [] for k in calls}
            for _ in range(a.rounds):
                order = list(calls.items())
                random.shuffle(order)
                for k, c in order:
                    start = time.perf_counter()
                    for _ in range(3):
                        c(*args)
                    samples[k].append((time.perf_counter() - start) / 3 * 1e3)
            print(f"{case} {rows}x{n}".ljust(16),
                  "  ".join(f"{k} {statistics.median(v):.3f} ms" for k, v in samples.items()), flush=True)


if __name__ == "__main__":
    main()
