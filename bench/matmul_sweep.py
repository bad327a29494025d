# ruff: noqa: B023 -- the closures run before the loop moves on
"""Sweep: which form of a persistent Triton matmul with a fused epilogue comes closest to cuBLAS
on this device. Beyond `matmul_probe.py` (which settled ember's current kernel), it tries
epilogues that leave through a TMA store, in two column halves ("subtile": half the registers
live at once, so the next tile's loads can start sooner), warp specialization, and deeper
pipelines; every variant against cuBLAS's mm alone, Inductor (cuBLAS + a bias+gelu kernel) and
cuBLASLt's own fused bias+gelu epilogue (`torch._addmm_activation`, tanh gelu: the reference for
what a fused epilogue saves). A screen with `do_bench`, then the best few interleaved.

    PYTHONPATH=. python bench/matmul_sweep.py [--shapes 8192x4096x4096,...] [--dual]
"""

from __future__ import annotations

import argparse
from time import perf_counter

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.common import interleaved_gpu_times, rel_error, table
from bench.matmul_probe import _epilogue, _products, _tile, problem


@triton.jit
def _erf_fast(x):
    """erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7): one exp, one division."""
    a = tl.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    r = 1.0 - p * tl.exp(-a * a)
    return tl.where(x < 0, -r, r)


@triton.jit
def _finish(acc, acc2, bias, on, N, DUAL: tl.constexpr, EPI: tl.constexpr = 0):
    if EPI == 1:  # no epilogue: the matmul alone
        return acc
    if EPI == 4:  # gelu with no bias: the math alone
        return 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    if DUAL:
        g = acc.to(tl.bfloat16).to(tl.float32)
        u = acc2.to(tl.bfloat16).to(tl.float32)
        return (g / (1.0 + tl.exp(-g))).to(tl.bfloat16).to(tl.float32) * u
    if EPI == 5:  # (bias: its values, loaded before the tile's K loop)
        x = acc + bias
    else:
        x = acc + tl.load(bias + on, mask=on < N, other=0.0).to(tl.float32)
    if EPI == 3:  # the bias alone
        return x
    if EPI == 2 or EPI == 5:
        return 0.5 * x * (1.0 + _erf_fast(x * 0.7071067811865476))
    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))


@triton.jit
def fused(A, B, B2, bias, C, M, N, K, DUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, GROUP_M: tl.constexpr, SMS: tl.constexpr, WS: tl.constexpr,
          FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr, SUBTILE: tl.constexpr, EPI: tl.constexpr = 0):
    da = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BM, BK])
    db = tl.make_tensor_descriptor(B, [K, N], [N, 1], [BK, BN])
    db2 = tl.make_tensor_descriptor(B2, [K, N], [N, 1], [BK, BN])
    if SUBTILE:
        dc = tl.make_tensor_descriptor(C, [M, N], [N, 1], [BM, BN // 2])
    else:
        dc = tl.make_tensor_descriptor(C, [M, N], [N, 1], [BM, BN])
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), tiles, SMS, flatten=FLATTEN, warp_specialize=WS):
        pm, pn = _tile(t, M, N, BM, BN, GROUP_M)
        if EPI == 5:
            on = pn * BN + tl.arange(0, BN // 2)[None, :]
            bias0 = tl.load(bias + on, mask=on < N, other=0.0).to(tl.float32)
            bias1 = tl.load(bias + on + BN // 2, mask=on + BN // 2 < N, other=0.0).to(tl.float32)
        acc, acc2 = _products(da, db, db2, pm, pn, K, DUAL, BM, BN, BK)
        if EPI == 5:
            a0, a1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            dc.store([pm * BM, pn * BN], _finish(a0, a0, bias0, on, N, DUAL, EPI).to(tl.bfloat16))
            dc.store([pm * BM, pn * BN + BN // 2], _finish(a1, a1, bias1, on, N, DUAL, EPI).to(tl.bfloat16))
        elif TMA_STORE:
            if SUBTILE:
                a0, a1 = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
                b0, b1 = tl.split(tl.permute(tl.reshape(acc2, (BM, 2, BN // 2)), (0, 2, 1)))
                on = pn * BN + tl.arange(0, BN // 2)[None, :]
                dc.store([pm * BM, pn * BN], _finish(a0, b0, bias, on, N, DUAL, EPI).to(tl.bfloat16))
                dc.store([pm * BM, pn * BN + BN // 2],
                         _finish(a1, b1, bias, on + BN // 2, N, DUAL, EPI).to(tl.bfloat16))
            else:
                on = pn * BN + tl.arange(0, BN)[None, :]
                dc.store([pm * BM, pn * BN], _finish(acc, acc2, bias, on, N, DUAL, EPI).to(tl.bfloat16))
        else:
            _epilogue(C, acc, acc2, bias, pm, pn, M, N, DUAL, BM, BN)


# name: (BM, BN, BK, warps, stages, group, WS, FLATTEN, TMA_STORE, SUBTILE[, programs per SM])
# Two programs per SM (tiles small enough that two fit) overlap one's epilogue with the other's
# products, as cuBLAS's ping-pong kernels do with two consumer warp groups.
ONE = {
    "2/SM 128x128 w8 s3 ptr": (128, 128, 64, 8, 3, 8, False, True, False, False, 2),
    "2/SM 128x128 w4 s3 ptr": (128, 128, 64, 4, 3, 8, False, True, False, False, 2),
    "2/SM 128x128 w8 s2 tma subtile": (128, 128, 64, 8, 2, 8, False, True, True, True, 2),
    "2/SM 128x128 w8 s3 ptr ws": (128, 128, 64, 8, 3, 8, True, True, False, False, 2),
    "2/SM 128x128 w8 s3 ptr not flat": (128, 128, 64, 8, 3, 8, False, False, False, False, 2),
    "ember now (128x256 s3 flat)": (128, 256, 64, 8, 3, 8, False, True, False, False),
    "tma store": (128, 256, 64, 8, 3, 8, False, True, True, False),
    "tma store subtile": (128, 256, 64, 8, 3, 8, False, True, True, True),
    "tma subtile not flat": (128, 256, 64, 8, 3, 8, False, False, True, True),
    "tma subtile s4": (128, 256, 64, 8, 4, 8, False, True, True, True),
    "tma subtile ws": (128, 256, 64, 8, 3, 8, True, True, True, True),
    "tma subtile ws not flat": (128, 256, 64, 8, 3, 8, True, False, True, True),
    "tma subtile group 16": (128, 256, 64, 8, 3, 16, False, True, True, True),
    "tma subtile group 4": (128, 256, 64, 8, 3, 4, False, True, True, True),
    "256x128 tma subtile": (256, 128, 64, 8, 3, 8, False, True, True, True),
    "128x128 w8 s4 tma subtile": (128, 128, 64, 8, 4, 8, False, True, True, True),
    "128x128 w4 s4 tma": (128, 128, 64, 4, 4, 8, False, True, True, False),
    "128x256 BK128 s2 tma subtile": (128, 256, 128, 8, 2, 8, False, True, True, True),
}
TWO = {
    "ember now (128x128 s3)": (128, 128, 64, 8, 3, 8, False, False, False, False),
    "tma store": (128, 128, 64, 8, 3, 8, False, False, True, False),
    "tma store subtile": (128, 128, 64, 8, 3, 8, False, False, True, True),
    "tma subtile s4": (128, 128, 64, 8, 4, 8, False, False, True, True),
    "tma subtile ws": (128, 128, 64, 8, 3, 8, True, False, True, True),
    "tma subtile flat": (128, 128, 64, 8, 3, 8, False, True, True, True),
    "tma subtile group 16": (128, 128, 64, 8, 3, 16, False, False, True, True),
}


def run_shape(M: int, K: int, N: int, dual: bool, top: int, rounds: int, only: str = "") -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    x, w, w2, b, fn = problem(M, K, N, dual)
    ref = fn(x.double(), w.double(), w2.double(), b.double())
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    ind = torch.compile(fn)
    flops = 2 * M * K * N * (2 if dual else 1)
    anchors = {"Inductor": lambda: ind(x, w, w2, b), "cuBLAS mm alone": lambda: x @ w}
    if dual:
        anchors["cuBLAS both mms"] = lambda: (x @ w, x @ w2)
    else:
        anchors["cuBLASLt bias+gelu(tanh) epilogue"] = lambda: torch._addmm_activation(b, x, w, use_gelu=True)
    errors = {"Inductor": rel_error(ind(x, w, w2, b), ref), "cuBLAS mm alone": float("nan"),
              "cuBLAS both mms": float("nan")}
    if not dual:
        errors["cuBLASLt bias+gelu(tanh) epilogue"] = rel_error(torch._addmm_activation(b, x, w, use_gelu=True), ref)
    screen, first, kernels, resources = {}, {}, {}, {}
    only = set(only.split(",")) if only else None
    for name, c in (TWO if dual else ONE).items():
        if only and name not in only:
            continue
        bm, bn, bk, warps, stages, group, ws, flat, tma_store, subtile = c[:10]
        programs = sms * (c[10] if len(c) > 10 else 1)
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        run = lambda bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, group=group, ws=ws, flat=flat, \
            tma_store=tma_store, subtile=subtile, tiles=tiles, programs=programs: fused[(min(programs, tiles),)](
                x, w, w2, b, out, M, N, K, dual, bm, bn, bk, group, programs, ws, flat, tma_store, subtile,
                num_warps=warps, num_stages=stages)
        start = perf_counter()
        try:
            out.fill_(float("nan"))
            compiled = run()
            torch.cuda.synchronize()
            resources[name] = f"{getattr(compiled, 'n_regs', '?')} / {compiled.metadata.shared // 1024}"
        except Exception as e:  # noqa: BLE001 -- a variant that does not build is reported, not fatal
            print(f"  {name}: failed: {str(e).splitlines()[0][:100]}")
            continue
        first[name] = (perf_counter() - start) * 1e3
        errors[name] = rel_error(out, ref)
        kernels[name] = run
        screen[name] = do_bench(run, warmup=10, rep=100, return_mode="median")
    for name, run in anchors.items():
        screen[name] = do_bench(run, warmup=10, rep=100, return_mode="median")
    rows = [(n, f"{ms * 1e3:.1f}", f"{flops / ms / 1e9:.0f}", f"{errors[n]:.1e}", f"{first.get(n, 0):.0f}",
             resources.get(n, "-")) for n, ms in sorted(screen.items(), key=lambda kv: kv[1])]
    title = f"{'silu(x@Wg)*(x@Wu)' if dual else 'gelu(x@W+b)'} bf16 {M}x{K}x{N}"
    print(f"{title}, screen (do_bench, one after another)")
    print(table(rows, ["variant", "us", "TFLOP/s", "rel err", "first call ms", "regs / smem KiB"]))
    best = sorted(kernels, key=screen.get)[:top]
    if "ember now (128x256 s3 flat)" in kernels and "ember now (128x256 s3 flat)" not in best:
        best.append("ember now (128x256 s3 flat)")
    if "ember now (128x128 s3)" in kernels and "ember now (128x128 s3)" not in best:
        best.append("ember now (128x128 s3)")
    variants = {**anchors, **{n: kernels[n] for n in best}}
    times = interleaved_gpu_times(variants, rounds=rounds, rep_ms=30)
    rows = [(n, f"{ms * 1e3:.1f}", f"{flops / ms / 1e9:.0f}", f"{times['Inductor'] / ms:.3f}")
            for n, ms in sorted(times.items(), key=lambda kv: kv[1])]
    print(f"{title}, interleaved ({rounds} rounds)")
    print(table(rows, ["variant", "us", "TFLOP/s", "vs Inductor"]))


def epilogue_cost(M: int, K: int, N: int, rounds: int) -> None:
    """What the epilogue costs inside the fused kernel: the same kernel with no epilogue, with
    erf gelu (libdevice), and with gelu from a cheaper erf, interleaved with the anchors."""
    bf = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=bf) * 0.05
    w = torch.randn(K, N, device="cuda", dtype=bf) * 0.05
    b = torch.randn(N, device="cuda", dtype=bf) * 0.05
    fn = lambda x, w, b: F.gelu(x @ w + b)  # noqa: E731
    ref = fn(x.double(), w.double(), b.double())
    ind = torch.compile(fn)
    out = torch.empty(M, N, device="cuda", dtype=bf)
    variants = {"Inductor": lambda: ind(x, w, b), "cuBLAS mm alone": lambda: x @ w,
                "cuBLASLt bias+gelu(tanh) epilogue": lambda: torch._addmm_activation(b, x, w, use_gelu=True)}
    errors = {}
    for label, ws in (("", False), (" ws", True)):
        for epi, what in ((1, "no epilogue"), (0, "gelu (libdevice erf)"), (2, "gelu (A&S erf)"),
                          (3, "bias alone"), (4, "gelu alone (libdevice)"), (5, "A&S gelu, bias loaded first")):
            tiles = triton.cdiv(M, 128) * triton.cdiv(N, 256)
            run = lambda epi=epi, ws=ws, tiles=tiles: fused[(min(sms, tiles),)](
                x, w, w, b, out, M, N, K, False, 128, 256, 64, 8, sms, ws, True, True, True, epi,
                num_warps=8, num_stages=3)
            run()
            torch.cuda.synchronize()
            name = f"tma subtile{label}: {what}"
            want = {1: x.double() @ w.double(), 3: x.double() @ w.double() + b.double(),
                    4: F.gelu(x.double() @ w.double())}.get(epi, ref)
            errors[name] = rel_error(out, want)
            variants[name] = run
    times = interleaved_gpu_times(variants, rounds=rounds, rep_ms=30)
    rows = [(n, f"{ms * 1e3:.1f}", f"{2 * M * K * N / ms / 1e9:.0f}", f"{errors.get(n, float('nan')):.1e}")
            for n, ms in sorted(times.items(), key=lambda kv: kv[1])]
    print(f"gelu(x@W+b) bf16 {M}x{K}x{N}: the epilogue's cost, interleaved ({rounds} rounds)")
    print(table(rows, ["variant", "us", "TFLOP/s", "rel err"]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x4096x4096")
    p.add_argument("--dual", action="store_true", help="silu(x@Wg)*(x@Wu) instead of gelu(x@W+b)")
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--epilogue-cost", action="store_true", help="the epilogue's share of the fused kernel")
    p.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    a = p.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for s in a.shapes.split(","):
        M, K, N = map(int, s.split("x"))
        if a.epilogue_cost:
            epilogue_cost(M, K, N, a.rounds)
        else:
            run_shape(M, K, N, a.dual, a.top, a.rounds, a.only)


if __name__ == "__main__":
    main()
