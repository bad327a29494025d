"""Would a CUDA C++ row kernel gain from keeping a computed value in registers for a later loop,
where the row is known to be kept? The GPU suite's softmax (bf16 16384 x 4096,
bench/gpu_fusion.py), its generated kernel edited by hand before it is built:

- ``base``: as generated;
- ``ct``: the row-kept test (``ember_cached``) a constant, as a kernel instantiated for kept
  rows would have it (the test's other arm then compiles away);
- ``keep``: ``ct``, and the sum loop's exp(x - max) kept in registers (``ember_keep3``, the
  exact exp: it is stored) for the store loop, which then only divides;

each at the launch's unroll settings (bench/row_unroll_probe.py: set_unroll). Error against
float64 and the output's bits against ``base``; time as bench/case_calls.py times. One device
call, for the probe's rows only (aligned, 4096 wide: every variant's row is kept):

    EMBER_AOT_CACHE=0 PYTHONPATH=. python bench/softmax_keep_probe.py [--unrolls 4,2] [--reps 30]
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ember  # noqa: E402
from bench.case_calls import median_us  # noqa: E402
from bench.common import table  # noqa: E402
from bench.gpu_fusion import softmax  # noqa: E402
from bench.row_unroll_probe import set_unroll  # noqa: E402
from ember.runtime import cuda_backend  # noqa: E402

KERNEL = "fused_amax_sub_exp_sum_div_0"
RENDER = cuda_backend._render


def constant_cached(src: str) -> str:
    return re.sub(r"const bool ember_cached = [^;]*;", "const bool ember_cached = true;", src)


def keep_exp(src: str) -> str:
    src = constant_cached(src)
    cache = "EmberVec<unsigned short, 8> ember_cache0[EMBER_UNROLL];"
    src = src.replace(cache, cache + "\n    float ember_keep3[EMBER_UNROLL][8];", 1)
    src = src.replace("const float v3 = ember_exp_ftz(v2);",
                      "const float v3 = ember_exp_approx(v2);\n              ember_keep3[ember_u][ember_k] = v3;", 1)
    store = src.index("// loop 3: store")
    head, tail = src[:store], src[store:]
    recomputed = """              const float v0 = ember_bf16_at(v0_vec, ember_k);
              const float v2 = (v0 - v1);
              const float v3 = ember_exp_approx(v2);"""
    tail = tail.replace(recomputed, "              const float v3 = ember_keep3[ember_u][ember_k];", 1)
    return head + tail


EDITS = {"base": lambda s: s, "ct": constant_cached, "keep": keep_exp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--unrolls", default="4,2")
    parser.add_argument("--variants", default="base,ct,keep")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    ref = softmax(x.double())
    base_out = None
    rows = []
    for unroll in map(int, args.unrolls.split(",")):
        for variant in args.variants.split(","):
            set_unroll(unroll)
            edit = EDITS[variant]
            cuda_backend._render = lambda k, edit=edit: edit(RENDER(k)) if k.name == KERNEL else RENDER(k)
            torch._dynamo.reset()
            compiled = ember.compile(softmax, options={"gpu_backend": "cuda"})
            out = compiled(x)
            base_out = out if base_out is None else base_out
            err = float((out.double() - ref).abs().max())
            same = bool(torch.equal(out, base_out))
            us = median_us(compiled, (x,), args.reps)
            rows.append((variant, unroll, f"{us:.1f}", f"{err:.2e}", same))
            print(f"{variant}, unroll {unroll}: {us:.1f} µs, error {err:.2e}, bits of base: {same}", flush=True)
    print("\n" + table(rows, ("variant", "unroll", "µs", "error", "same bits as base")))

if __name__ == "__main__":
    main()
