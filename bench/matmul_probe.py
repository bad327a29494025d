# ruff: noqa: B023 -- the closures run before the loop moves on
"""Probe: the fastest shape of a Triton matmul kernel with a fused epilogue on this device, against
cuBLAS (+ an epilogue kernel) and Inductor: hand-written kernels in the form ember generates
(device-side TMA descriptors), one tile per program or persistent (a program per SM walking
tiles), with and without warp specialization, over a few tile configurations.

    PYTHONPATH=. python bench/matmul_probe.py [--interleaved]
"""

from __future__ import annotations

from time import perf_counter

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.common import interleaved_gpu_times, rel_error, table


@triton.jit
def _tile(t, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_n = tl.cdiv(N, BN)
    in_group = GROUP_M * tiles_n
    first_m = (t // in_group) * GROUP_M
    group_m = tl.minimum(tl.cdiv(M, BM) - first_m, GROUP_M)
    return first_m + (t % in_group) % group_m, (t % in_group) // group_m


@triton.jit
def _epilogue(C, acc, acc2, bias, pm, pn, M, N, DUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    om = pm * BM + tl.arange(0, BM)[:, None]
    on = pn * BN + tl.arange(0, BN)[None, :]
    if DUAL:
        g = acc.to(C.dtype.element_ty).to(tl.float32)
        u = acc2.to(C.dtype.element_ty).to(tl.float32)
        y = (g / (1.0 + tl.exp(-g))).to(C.dtype.element_ty).to(tl.float32) * u
    else:
        x = acc + tl.load(bias + on, mask=on < N, other=0.0).to(tl.float32)
        y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(C + om * N + on, y.to(C.dtype.element_ty), mask=(om < M) & (on < N))


@triton.jit
def _products(da, db, db2, pm, pn, K, DUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """One tile's sums over K: x @ W, and x @ W2 beside it when DUAL (x's loads shared)."""
    acc = tl.zeros((BM, BN), tl.float32)
    acc2 = tl.zeros((BM, BN), tl.float32)
    for k0 in range(0, K, BK):
        a = da.load([pm * BM, k0])
        acc = tl.dot(a, db.load([k0, pn * BN]), acc)
        if DUAL:
            acc2 = tl.dot(a, db2.load([k0, pn * BN]), acc2)
    return acc, acc2


@triton.jit
def one_tile(A, B, B2, bias, C, M, N, K, DUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr, GROUP_M: tl.constexpr):
    pm, pn = _tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    da = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BM, BK])
    db = tl.make_tensor_descriptor(B, [K, N], [N, 1], [BK, BN])
    db2 = tl.make_tensor_descriptor(B2, [K, N], [N, 1], [BK, BN])
    acc, acc2 = _products(da, db, db2, pm, pn, K, DUAL, BM, BN, BK)
    _epilogue(C, acc, acc2, bias, pm, pn, M, N, DUAL, BM, BN)


@triton.jit
def persistent(A, B, B2, bias, C, M, N, K, DUAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr, SMS: tl.constexpr, WS: tl.constexpr,
               FLATTEN: tl.constexpr):
    da = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BM, BK])
    db = tl.make_tensor_descriptor(B, [K, N], [N, 1], [BK, BN])
    db2 = tl.make_tensor_descriptor(B2, [K, N], [N, 1], [BK, BN])
    tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), tiles, SMS, flatten=FLATTEN, warp_specialize=WS):
        pm, pn = _tile(t, M, N, BM, BN, GROUP_M)
        acc, acc2 = _products(da, db, db2, pm, pn, K, DUAL, BM, BN, BK)
        _epilogue(C, acc, acc2, bias, pm, pn, M, N, DUAL, BM, BN)


ONE = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4)]
TWO = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4)]


def problem(M: int, K: int, N: int, dual: bool):
    """Random bf16 operands (x, W, W2, bias) and the function: gelu(x @ W + b), or with ``dual``
    silu(x @ W) * (x @ W2)."""
    bf = torch.bfloat16
    x = torch.randn(M, K, device="cuda", dtype=bf) * 0.05
    w = torch.randn(K, N, device="cuda", dtype=bf) * 0.05
    w2 = torch.randn(K, N, device="cuda", dtype=bf) * 0.05
    b = torch.randn(N, device="cuda", dtype=bf) * 0.05
    if dual:
        return x, w, w2, b, lambda x, w, w2, b: F.silu(x @ w) * (x @ w2)
    return x, w, w2, b, lambda x, w, w2, b: F.gelu(x @ w + b)


def main() -> None:
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    torch.manual_seed(0)
    bf = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for dual, (M, K, N) in ((False, (8192, 4096, 4096)), (True, (8192, 4096, 11008))):
        x, w, w2, b, fn = problem(M, K, N, dual)
        ref = fn(x.double(), w.double(), w2.double(), b.double())
        ind = torch.compile(fn)
        out = torch.empty(M, N, device="cuda", dtype=bf)
        flops = 2 * M * K * N * (2 if dual else 1)
        rows = []

        def time(name, run, check=True):
            start = perf_counter()
            if check:
                out.fill_(float("nan"))
                run()
                torch.cuda.synchronize()
                err = rel_error(out, ref)
            else:
                err = rel_error(run(), ref)
            first = perf_counter() - start  # the first call: Triton's compile, Inductor's too
            ms = do_bench(run, warmup=25, rep=200)
            rows.append((name, f"{ms * 1e3:.1f}", f"{flops / ms / 1e9:.0f}", f"{err:.1e}", f"{first * 1e3:.0f}"))

        time("eager", lambda: fn(x, w, w2, b), check=False)
        time("Inductor", lambda: ind(x, w, w2, b), check=False)
        for bm, bn, bk, wp, st in TWO if dual else ONE:
            tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
            cfg = f"{bm}x{bn}x{bk} w{wp} s{st}"
            try:
                time(f"one tile {cfg}", lambda: one_tile[(tiles,)](  # noqa: B023
                    x, w, w2, b, out, M, N, K, dual, bm, bn, bk, 8, num_warps=wp, num_stages=st))  # noqa: B023
            except Exception as e:  # noqa: BLE001
                rows.append((f"one tile {cfg}", "failed", str(e)[:50], "-", "-"))
            for ws, flat in ((False, False), (False, True), (True, False), (True, True)):
                name = f"persistent {cfg}{' ws' if ws else ''}{' flat' if flat else ''}"
                try:
                    time(name, lambda: persistent[(min(sms, tiles),)](  # noqa: B023
                        x, w, w2, b, out, M, N, K, dual, bm, bn, bk, 8, sms, ws, flat,  # noqa: B023
                        num_warps=wp, num_stages=st))  # noqa: B023
                except Exception as e:  # noqa: BLE001
                    rows.append((name, "failed", str(e)[:50], "-", "-"))
        print(f"{'silu(x@Wg)*(x@Wu)' if dual else 'gelu(x@W+b)'} bf16 {M}x{K}x{N}")
        print(table(rows, ["variant", "us", "TFLOP/s", "rel err", "first call ms"]))


def interleaved() -> None:
    """The fused gelu linear layer against Inductor over a few K, all variants interleaved (10
    rounds): which kernel shape wins, and from which K on cuBLAS plus an epilogue kernel does."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    bf = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fn = lambda x, w, b: F.gelu(x @ w + b)  # noqa: E731
    for M, K, N in ((8192, 4096, 4096), (8192, 1024, 4096), (8192, 512, 4096), (4096, 4096, 16384)):
        x = torch.randn(M, K, device="cuda", dtype=bf) * 0.05
        w = torch.randn(K, N, device="cuda", dtype=bf) * 0.05
        b = torch.randn(N, device="cuda", dtype=bf) * 0.05
        ref = fn(x.double(), w.double(), b.double())
        out = torch.empty(M, N, device="cuda", dtype=bf)
        ind = torch.compile(fn)

        def fused(bm, bn, bk, warps, stages, ws, flat, group=8):
            tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
            return lambda: persistent[(min(sms, tiles),)](x, w, w, b, out, M, N, K, False, bm, bn, bk, group, sms,
                                                          ws, flat, num_warps=warps, num_stages=stages)

        variants = {"Inductor": lambda: ind(x, w, b), "cuBLAS mm alone": lambda: x @ w,
                    "ember's (flat s3)": fused(128, 256, 64, 8, 3, False, True),
                    "ws flat s3": fused(128, 256, 64, 8, 3, True, True),
                    "ws flat s4": fused(128, 256, 64, 8, 4, True, True),
                    "flat s3 group 16": fused(128, 256, 64, 8, 3, False, True, 16),
                    "BK 128 flat s2": fused(128, 256, 128, 8, 2, False, True)}
        errors, first = {}, {}
        for name, run in list(variants.items()):
            start = perf_counter()
            try:
                out.fill_(float("nan"))
                got = run()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"  {name}: failed {str(e)[:80]}")
                del variants[name]
                continue
            first[name] = (perf_counter() - start) * 1e3
            errors[name] = rel_error(got if name == "Inductor" else out, ref) if name != "cuBLAS mm alone" else 0.0
        times = interleaved_gpu_times(variants, rounds=10, rep_ms=20)
        rows = [(name, f"{ms * 1e3:.1f}", f"{2 * M * K * N / ms / 1e9:.0f}", f"{errors[name]:.1e}",
                 f"{first[name]:.0f}") for name, ms in times.items()]
        print(f"gelu(x@W+b) bf16 {M}x{K}x{N}, interleaved")
        print(table(rows, ["variant", "us", "TFLOP/s", "rel err", "first call ms"]))


if __name__ == "__main__":
    import sys
    interleaved() if "--interleaved" in sys.argv else main()
