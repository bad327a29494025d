"""eager vs Inductor vs ember on this machine's CPU (issue: foundation).

    python bench/cpu_fusion.py [--reps 25] [--quick] [--train] [--math] [--only TEXT]

Cases: relu(x)+y+1 (16M fp32), RMSNorm 4096x4096 fp32 and softmax 4096x4096 fp32 (both the
manual formulas of ../shared/BENCHMARKS.md), torch.softmax over bf16 and fp16 rows and LayerNorm
over bf16 rows (4096 x 1024), the padded GIoU loss (1024 x 256 boxes), tanh and
tanh-approximated GELU (16M fp32: ember's own tanh), ELU, softplus and BCE with logits (16M fp32:
ember's own expm1 and log1p), the KL divergence (4096x4096 fp32: ember's own log), and attention
heads merged into rows, joined side by side, and joined with their column sums (an
in-projection's gradient and its bias's). ``--only`` runs the cases whose name contains its
text; ``--math`` runs instead one case for each float32 function ember computes without libm
calls (exp2, log, log2, log10, sinh, cosh, atan, asin, acos, atan2, pow; 16M fp32).
Checks every variant against a float64 reference first (16-bit outputs within their rounding),
then prints median times and ratios.
``--train`` times the backward alone of RMSNorm and LayerNorm (4096 x 4096 fp32), with ember's
column sums in the row kernel (passes/chunks.py) and without (``row_chunks=0``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, median_times, rel_error, table  # noqa: E402

import ember  # noqa: E402
from ember.workloads.giou import make_batch, padded_giou_loss  # noqa: E402


def relu_add(x, y):
    return torch.relu(x) + y + 1


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def softmax(x):
    e = torch.exp(x - x.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def torch_softmax(x):
    return torch.softmax(x, -1)


def cases(quick: bool):
    n = 1 << 20 if quick else 16 << 20
    rows = 1024 if quick else 4096
    batch = 256 if quick else 1024
    heads_t = 64 if quick else 256
    pred, _targets, padded = make_batch(batch)
    return [
        ("relu(x)+y+1 fp32 16M", relu_add, lambda: (torch.randn(n), torch.randn(n))),
        ("RMSNorm fp32 4096x4096", rmsnorm, lambda: (torch.randn(rows, 4096), torch.randn(4096))),
        ("softmax fp32 4096x4096", softmax, lambda: (torch.randn(rows, 4096),)),
        ("torch.softmax bf16 4096x1024", torch_softmax, lambda: (torch.randn(rows, 1024, dtype=torch.bfloat16),)),
        ("torch.softmax fp16 4096x1024", torch_softmax, lambda: (torch.randn(rows, 1024, dtype=torch.float16),)),
        ("LayerNorm bf16 4096x1024", layer_norm, lambda: (torch.randn(rows, 1024, dtype=torch.bfloat16),
                                                          torch.randn(1024, dtype=torch.bfloat16),
                                                          torch.randn(1024, dtype=torch.bfloat16))),
        ("padded GIoU loss 1024x256", padded_giou_loss, lambda: (pred, padded)),
        ("tanh(x) fp32 16M", torch.tanh, lambda: (torch.randn(n),)),
        ("gelu(x, 'tanh') fp32 16M", gelu_tanh, lambda: (torch.randn(n),)),
        # activations and a loss on expm1 and log1p (ember_expm1, ember_log1p)
        ("elu(x) fp32 16M", torch.nn.functional.elu, lambda: (torch.randn(n),)),
        ("softplus(x) fp32 16M", torch.nn.functional.softplus, lambda: (torch.randn(n),)),
        ("BCE with logits fp32 16M", torch.nn.functional.binary_cross_entropy_with_logits,
         lambda: (torch.randn(n), torch.rand(n))),
        # a loss on log (ember_log, codegen/cpp_math.py; --math times the functions alone)
        ("KL divergence fp32 4096x4096", kl_divergence,
         lambda: (torch.log_softmax(torch.randn(rows, 4096), -1), torch.softmax(torch.randn(rows, 4096), -1))),
        # rotary position embedding: cos and sin of position x frequency (ember_cos, ember_sin)
        ("rotary embedding fp32 8x4096x16x64", rotary, lambda: (torch.randn(8, 4096, 16, 64),)),
        # attention's heads (B, H, T, D) written as (T*B, H*D) rows, as nn.MultiheadAttention's
        # output; and q, k, v's three joined side by side, as its in-projection's gradient
        ("heads merged fp32 8x8x256x64", merge_heads, lambda: (torch.randn(8, 8, heads_t, 64),)),
        ("q, k, v heads joined fp32 3x8x8x256x64", join_heads,
         lambda: tuple(torch.randn(8, 8, heads_t, 64) for _ in range(3))),
        # the same joined with their column sums: the in-projection's gradient and its bias's
        ("q, k, v joined + bias grad fp32 3x4x4x256x64", join_heads_and_sum,
         lambda: tuple(torch.randn(4, 4, heads_t, 64) for _ in range(3))),
    ]


def math_cases(quick: bool):
    """One case for each float32 function of codegen/cpp_math.py, over its domain, and float64's
    exp, expm1, tanh, log and log1p (``--math``)."""
    n = 1 << 20 if quick else 16 << 20
    unit = lambda: (torch.rand(n) * 1.98 - 0.99,)  # noqa: E731
    positive = lambda: (torch.rand(n) * 4 + 1e-3,)  # noqa: E731
    normal = lambda: (torch.randn(n) * 3,)  # noqa: E731
    return [(f"{name} fp32 16M", fn, make) for name, fn, make in [
        ("exp2(x)", torch.exp2, normal), ("log(x)", torch.log, positive), ("log2(x)", torch.log2, positive),
        ("log10(x)", torch.log10, positive),
        ("sinh(x)", torch.sinh, normal), ("cosh(x)", torch.cosh, normal), ("atan(x)", torch.atan, normal),
        ("asin(x)", torch.asin, unit), ("acos(x)", torch.acos, unit),
        ("atan2(y, x)", torch.atan2, lambda: (torch.randn(n), torch.randn(n))),
        ("x ** 2.5", pow_scalar, positive), ("x ** y", torch.pow, lambda: (torch.rand(n) * 4, torch.randn(n))),
        ("xlogy(x, y)", torch.xlogy, lambda: (torch.rand(n), torch.rand(n))),
        ("sin(x)", torch.sin, normal), ("cos(x)", torch.cos, normal), ("tan(x)", torch.tan, normal),
        ("sin(x), x up to 1e5", torch.sin, lambda: (torch.rand(n) * 1e5,)),
    ]] + [(f"{name} fp64 {n // 8 >> 10}K", fn, make) for name, fn, make in [  # float64: exp, expm1, tanh, log and log1p
        ("exp(x)", torch.exp, lambda: (torch.randn(n // 8, dtype=torch.float64) * 10,)),
        ("softmax", lambda x: torch.softmax(x, -1), lambda: (torch.randn(n // 8 // 1024, 1024, dtype=torch.float64),)),
        ("log(x)", torch.log, lambda: (torch.rand(n // 8, dtype=torch.float64) * 100,)),
        ("tanh(x)", torch.tanh, lambda: (torch.randn(n // 8, dtype=torch.float64) * 3,)),
        ("expm1(x)", torch.expm1, lambda: (torch.randn(n // 8, dtype=torch.float64) * 3,)),
        ("silu(x)", torch.nn.functional.silu, lambda: (torch.randn(n // 8, dtype=torch.float64) * 3,)),
        ("softplus(x)", torch.nn.functional.softplus, lambda: (torch.randn(n // 8, dtype=torch.float64) * 3,)),
        ("log_softmax", lambda x: torch.log_softmax(x, -1),
         lambda: (torch.randn(n // 8 // 1024, 1024, dtype=torch.float64),)),
    ]]


def rotary(x):
    """RoPE over (B, T, H, D), its angles computed in the graph (as most models do)."""
    t, d = x.shape[1], x.shape[3]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def pow_scalar(x):
    return x ** 2.5


def merge_heads(x):
    b, h, t, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(t * b, h * d)


def join_heads(q, k, v):
    return torch.cat([merge_heads(q), merge_heads(k), merge_heads(v)], 1)


def join_heads_and_sum(q, k, v):
    g = join_heads(q, k, v)
    return g, g.sum(0)


def kl_divergence(logp, target):
    return torch.nn.functional.kl_div(logp, target, reduction="batchmean")


def gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def backward_times(rows: int, reps: int) -> list[list[str]]:
    """The backward alone (``retain_graph``), each variant against float64 eager's gradients."""
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False  # (compiled backwards run again on one graph)
    out_rows = []
    for name, fn, n_params in (("RMSNorm bwd fp32 4096x4096", rmsnorm, 1),
                               ("LayerNorm bwd fp32 4096x4096", layer_norm, 2)):
        torch.manual_seed(0)
        inputs = [torch.randn(rows, 4096, requires_grad=True)]
        inputs += [torch.randn(4096, requires_grad=True) for _ in range(n_params)]
        grad = torch.randn(rows, 4096)
        ref = torch.autograd.grad(fn(*[t.double() for t in inputs]), inputs, grad.double())
        variants = {"eager": fn, "inductor": torch.compile(fn), "ember": ember.compile(fn),
                    "ember unchunked": ember.compile(fn, options={"row_chunks": 0})}
        calls, errors = {}, {}
        for key, f in variants.items():
            out = f(*inputs)
            calls[key] = lambda out=out, xs=inputs, g=grad: torch.autograd.grad(out, xs, g, retain_graph=True)
            errors[key] = max(rel_error(g, r) for g, r in zip(calls[key](), ref))
        times = median_times(calls, reps=reps)
        out_rows.append([name, *(f"{times[k] * 1e3:.2f}" for k in variants),
                         f"{times['inductor'] / times['ember']:.2f}x", f"{errors['ember']:.1e}"])
        print(f"  {name}: done", file=sys.stderr)
    return out_rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=25)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--train", action="store_true", help="backward passes only")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--math", action="store_true", help="the float32 math functions' cases instead")
    args = parser.parse_args()
    # (every case compiles a torch function through Dynamo's one wrapper of builtins: past its
    # recompile limit, 8, the later cases would run eager under both compilers)
    torch._dynamo.config.recompile_limit = 64
    print(f"# {machine()}, {time.strftime('%Y-%m-%d')}")
    if args.train:
        rows = backward_times(1024 if args.quick else 4096, args.reps)
        print(table(rows, ["case", "eager ms", "Inductor ms", "ember ms", "ember unchunked ms", "vs Inductor",
                           "ember rel err"]))
        return 0
    rows, failed = [], False
    for name, fn, make in (math_cases if args.math else cases)(args.quick):
        if args.only not in name:
            continue
        inputs = make()
        inductor = torch.compile(fn)
        fast = ember.compile(fn)
        ref = fn(*(x.double() for x in inputs))
        start = time.perf_counter()
        out = fast(*inputs)
        ember_compile = time.perf_counter() - start
        start = time.perf_counter()
        ind_out = inductor(*inputs)
        inductor_compile = time.perf_counter() - start
        errors = {"eager": rel_error(fn(*inputs), ref), "inductor": rel_error(ind_out, ref),
                  "ember": rel_error(out, ref)}
        if errors["ember"] > (1e-2 if inputs[0].dtype in (torch.bfloat16, torch.float16) else 1e-4):
            failed = True
        variants = {"eager": fn, "inductor": inductor, "ember": fast}
        times = median_times({k: (lambda f=f, xs=inputs: f(*xs)) for k, f in variants.items()}, reps=args.reps)
        rows.append([name, f"{times['eager'] * 1e3:.2f}", f"{times['inductor'] * 1e3:.2f}",
                     f"{times['ember'] * 1e3:.2f}", f"{times['eager'] / times['ember']:.2f}x",
                     f"{times['inductor'] / times['ember']:.2f}x", f"{errors['ember']:.1e}",
                     f"{ember_compile:.1f} / {inductor_compile:.1f}"])
        print(f"  {name}: done", file=sys.stderr)
    print(table(rows, ["case", "eager ms", "Inductor ms", "ember ms", "vs eager", "vs Inductor",
                       "ember rel err", "compile s (ember / Inductor)"]))
    print(f"ember.stats(): {ember.stats()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
