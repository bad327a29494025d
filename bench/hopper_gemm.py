# ruff: noqa: B023, UP031 -- closures run before the loop moves on; the CUDA source is %-formatted
"""Probe: a hand-written Hopper matmul with its epilogue, against cuBLAS and Inductor.

gelu(x @ W + b) in bf16 loses 3-4% to Inductor at 8192 x 4096 x 4096 when Triton fuses the
epilogue (bench/RESULTS.md, twenty-third run): gelu's math runs while the tensor cores wait.
This kernel is cuBLAS's ping-pong shape, written out: one producer warp group loads operand
tiles with TMA into a ring of shared-memory stages; two consumer warp groups each own a
128 x 128 output tile, take turns on the tensor cores (wgmma), and one's epilogue runs while
the other's products are computed. CUDA C++ with inline PTX, compiled by NVRTC for sm_90a.

    PYTHONPATH=. python bench/hopper_gemm.py [--case gelu|swiglu|gelu_saved] [--shapes 8192x4096x4096]
                                             [--rounds 8] [--check-only]
"""

from __future__ import annotations

import argparse
import ctypes

import torch
import torch.nn.functional as F

import ember
from ember.codegen.cuda_matmul import PRELUDE, hopper_helpers

BM, BN, BK = 128, 128, 64


def _wgmma_asm(n: int) -> str:
    """The wgmma.mma_async m64nNk16 bf16 -> f32 call, A and B from shared memory, B N-major."""
    regs = n // 2
    acc = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    return (
        f"EMBER_FN void wgmma_m64n{n}(float* d, uint64_t da, uint64_t db, int accumulate) {{\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
        f'    "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{acc}}},"\n'
        f'    " %{regs}, %{regs + 1}, p, 1, 1, 0, 1;\\n}}\\n"\n'
        f'    : {outs}\n'
        f'    : "l"(da), "l"(db), "r"(accumulate));\n'
        f"}}\n")


def source(stages: int = 6, epilogue: str = "gelu", bn: int = BN, cluster_mode: int = 0) -> str:
    """The kernel's CUDA C++ source. ``epilogue``: 'none' (the product), 'bias', 'gelu'; ``bn``
    columns a tile (128, or 192: a sixth less operand traffic from L2 per product, 192
    accumulator registers a thread). ``cluster_mode``, blocks in pairs (clusters) taking vertically
    adjacent tiles: 0 none; 1 clusters, blocks otherwise independent; 2 each consumer also frees
    its stage in both blocks; 3 each block also loads half of the pair's shared B tile for both
    (TMA multicast: half the B traffic from L2)."""
    math = {
        "none": "float y0 = a0, y1 = a1;",
        "bias": "float y0 = a0 + b0, y1 = a1 + b1;",
        "gelu": ("float s0 = ember_round_bf16(a0 + b0), s1 = ember_round_bf16(a1 + b1);\n"
                 "      float y0 = 0.5f * s0 * (1.0f + erff(s0 * 0.7071067811865476f));\n"
                 "      float y1 = 0.5f * s1 * (1.0f + erff(s1 * 0.7071067811865476f));"),
    }[epilogue]
    return PRELUDE + hopper_helpers() + r"""
#define BM %(BM)d
#define BN %(BN)d
#define BK %(BK)d
#define STAGES %(STAGES)d
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BK * BN * 2)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define MC %(MC)d
// (ember's Hopper helpers come first: TMA, mbarriers, descriptors, wgmma; codegen/cuda_matmul.py)
EMBER_FN uint32_t bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %%0, %%1, %%2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
%(WGMMA)s
EMBER_FN void tma_load_both(uint32_t dst, const EmberTensorMap* map, uint32_t bar, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%%0], [%%1, {%%3, %%4}], [%%2], %%5;"
               :: "r"(dst), "l"((uint64_t)map), "r"(bar), "r"(inner), "r"(outer), "h"((uint16_t)3) : "memory");
}
EMBER_FN void arrive_at(uint32_t bar, uint32_t cta) {  // on block cta's barrier at this offset
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %%0, %%1, %%2;" : "=r"(remote) : "r"(bar), "r"(cta));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%%0];" :: "r"(remote) : "memory");
}
EMBER_FN void wait_cluster(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%%0], %%1;\n"
               "@!p bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
EMBER_FN void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
extern "C" __global__ void __launch_bounds__(384, 1)
#if MC > 0
__cluster_dims__(2, 1, 1)
#endif
matmul_bias_%(EPI)s_pingpong(const __grid_constant__ EmberTensorMap a_map, const __grid_constant__ EmberTensorMap b_map,
                   uint16_t* __restrict__ out, const uint16_t* __restrict__ bias, int M, int N, int K) {
  extern __shared__ unsigned char smem_raw[];
  uint32_t base = (ember_smem(smem_raw) + 1023) & ~1023u;
  uint32_t bars = base + STAGES * STAGE_BYTES;  // full[STAGES], empty[STAGES], order[2]
  // (through a shuffle: uniform registers for the stage and descriptor arithmetic, as ember's template)
  int wg = __shfl_sync(0xffffffff, (int)threadIdx.x / 128, 0), t = threadIdx.x %% 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      ember_mbar_init(bars + 8 * s, 1);
      ember_mbar_init(bars + 8 * (STAGES + s), MC >= 2 ? 2 : 1);
    }
    ember_mbar_init(bars + 8 * (2 * STAGES), 1);
    ember_mbar_init(bars + 8 * (2 * STAGES + 1), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
#if MC > 0
  cluster_sync();  // both blocks' barriers exist before either one's loads or arrivals reach them
  uint32_t rank, cid, ncl;
  asm volatile("mov.u32 %%0, %%%%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %%0, %%%%clusterid.x;" : "=r"(cid));
  asm volatile("mov.u32 %%0, %%%%nclusterid.x;" : "=r"(ncl));
  const int rows_of_tiles = ((M + BM - 1) / BM + 1) / 2, step = 2;  // pairs of tile rows
#else
  __syncthreads();
  const uint32_t rank = 0, cid = blockIdx.x, ncl = gridDim.x;
  const int rows_of_tiles = (M + BM - 1) / BM, step = 1;
#endif
  int tiles_n = (N + BN - 1) / BN, tiles = rows_of_tiles * tiles_n;
  int k_blocks = (K + BK - 1) / BK;
  int mine = tiles > (int)cid ? (tiles - 1 - (int)cid) / (int)ncl + 1 : 0;
  if (wg == 0) {  // producer: one thread issues every TMA load, in the consumers' order
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      for (int i = 0; i < mine; ++i) {
        int pm, pn;
        ember_tile_of(cid + i * ncl, rows_of_tiles, tiles_n, pm, pn);
        pm = pm * step + rank;
        for (int kb = 0; kb < k_blocks; ++kb) {
          int n = i * k_blocks + kb, s = n %% STAGES;
#if MC >= 2
          if (n >= STAGES) wait_cluster(bars + 8 * (STAGES + s), ((n / STAGES) - 1) & 1);
#else
          if (n >= STAGES) ember_mbar_wait(bars + 8 * (STAGES + s), ((n / STAGES) - 1) & 1);
#endif
          uint32_t full = bars + 8 * s, stage = base + s * STAGE_BYTES;
          ember_mbar_expect(full, STAGE_BYTES);
          ember_tma_load(stage, &a_map, full, kb * BK, pm * BM);
#if MC == 3
          tma_load_both(stage + A_BYTES + rank * (BK * 128), &b_map, full, pn * BN + rank * 64, kb * BK);
#else
          for (int h = 0; h < BN / 64; ++h)
            ember_tma_load(stage + A_BYTES + h * (BK * 128), &b_map, full, pn * BN + h * 64, kb * BK);
#endif
        }
      }
    }
  } else {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
  int c = wg - 1, warp = t / 32, lane = t %% 32;
  auto release = [&](uint32_t bar) {  // a stage this consumer has read: free it in every block that loads it
#if MC >= 2
    arrive_at(bar, 0);
    arrive_at(bar, 1);
#else
    ember_mbar_arrive(bar);
#endif
  };
  float acc[2][BN / 2];
  for (int j = 0; 2 * j + c < mine; ++j) {
    int i = 2 * j + c;
    if (i > 0) ember_mbar_wait(bars + 8 * (2 * STAGES + c), (c ? j : j - 1) & 1);  // the other's mainloop issued
    int pm, pn;
    ember_tile_of(cid + i * ncl, rows_of_tiles, tiles_n, pm, pn);
    pm = pm * step + rank;
    for (int kb = 0; kb < k_blocks; ++kb) {
      int n = i * k_blocks + kb, s = n %% STAGES;
      ember_mbar_wait(bars + 8 * s, (n / STAGES) & 1);
      uint32_t a = base + s * STAGE_BYTES, b = a + A_BYTES;
      ember_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        uint64_t db = ember_smem_desc(b + kk * 16 * 128, BK * 128, 8 * 128);
        wgmma_m64n%(BN)d(acc[0], ember_smem_desc(a + kk * 32, 16, 8 * 128), db, kb | kk);
        wgmma_m64n%(BN)d(acc[1], ember_smem_desc(a + 64 * 128 + kk * 32, 16, 8 * 128), db, kb | kk);
      }
      ember_wgmma_commit();
      if (kb > 0) {
        ember_wgmma_wait<1>();
        if (t == 0) release(bars + 8 * (STAGES + (n - 1) %% STAGES));
      }
    }
    if (t == 0) ember_mbar_arrive(bars + 8 * (2 * STAGES + (1 - c)));  // the other consumer may start
    ember_wgmma_wait<0>();
    if (t == 0) release(bars + 8 * (STAGES + (i * k_blocks + k_blocks - 1) %% STAGES));
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int r = 0; r < BN / 2; ++r) ember_keep(acc[h][r]);
    // epilogue: thread t holds rows 16*warp + lane/4 (+8) and column pairs 8*q + 2*(lane%%4)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < BN / 8; ++q) {
        int col = pn * BN + 8 * q + 2 * (lane %% 4);
        if (col >= N) continue;
        uint32_t bb = *(const uint32_t*)(bias + col);
        float b0 = __uint_as_float(bb << 16), b1 = __uint_as_float(bb & 0xFFFF0000u);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          int row = pm * BM + 64 * h + 16 * warp + lane / 4 + 8 * half;
          if (row >= M) continue;
          float a0 = ember_round_bf16(acc[h][4 * q + 2 * half]), a1 = ember_round_bf16(acc[h][4 * q + 2 * half + 1]);
          %(MATH)s
          *(uint32_t*)(out + (long long)row * N + col) = bf16x2(y0, y1);
        }
      }
    }
  }
  }
#if MC > 0
  cluster_sync();  // neither block leaves while the other may still load into it or arrive on it
#endif
}
""" % {"BM": BM, "BN": bn, "BK": BK, "STAGES": stages, "EPI": epilogue, "MATH": math, "MC": cluster_mode,
       "WGMMA": _wgmma_asm(bn)}


def smem_bytes(stages: int, bn: int = BN) -> int:
    return 1024 + stages * (BM * BK + BK * bn) * 2 + (2 * stages + 2) * 8


class HopperMatmul:
    """Compile once (NVRTC, sm_90a), then launch on PyTorch's current stream."""

    def __init__(self, stages: int = 6, epilogue: str = "gelu", bn: int = BN, cluster_mode: int = 0):
        from pathlib import Path

        from ember.runtime import cuda_backend as cb
        self.cb, self.stages, self.epilogue, self.bn, self.cluster_mode = cb, stages, epilogue, bn, cluster_mode
        self.name = f"matmul_bias_{epilogue}_pingpong"
        text = source(stages, epilogue, bn, cluster_mode)
        image, _, _ = cb.compile_module(text, "sm_90a", Path("/tmp/ember_hopper_cache"))
        self.module = cb.CudaModule(image, [self.name])
        self.driver = cb._driver()
        self.fn = None

    def _map(self, t: torch.Tensor, box_inner: int, box_outer: int):
        d = self.driver
        rows, cols = t.shape
        err, tmap = d.cuTensorMapEncodeTiled(
            d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, t.data_ptr(),
            [d.cuuint64_t(cols), d.cuuint64_t(rows)], [d.cuuint64_t(t.stride(0) * 2)],
            [d.cuuint32_t(box_inner), d.cuuint32_t(box_outer)], [d.cuuint32_t(1), d.cuuint32_t(1)],
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        self.cb._check(d, err, "cuTensorMapEncodeTiled")
        return tmap

    def __call__(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        d = self.driver
        M, K = x.shape
        N = w.shape[1]
        if self.fn is None:
            self.fn = self.module.functions(x.device.index or 0)[self.name][0]
            attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            smem = smem_bytes(self.stages, self.bn)
            self.cb._check(d, d.cuFuncSetAttribute(self.fn, attr, smem)[0], "cuFuncSetAttribute")
            self.sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        a_map, b_map = self._map(x, BK, BM), self._map(w, 64, BK)
        slots = [ctypes.c_void_p(out.data_ptr()), ctypes.c_void_p(b.data_ptr()),
                 ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K)]
        argv = (ctypes.c_void_p * 7)(a_map.getPtr(), b_map.getPtr(), *[ctypes.addressof(s) for s in slots])
        tiles = -(-M // BM) * -(-N // self.bn)
        grid = min(self.sms, tiles)
        if self.cluster_mode:  # pairs of blocks, each pair a pair of tile rows
            grid = 2 * min(self.sms // 2, -(-M // (2 * BM)) * -(-N // self.bn))
        stream = torch.cuda.current_stream().cuda_stream
        (err,) = d.cuLaunchKernel(self.fn, grid, 1, 1, 384, 1, 1, smem_bytes(self.stages, self.bn),
                                  stream, ctypes.addressof(argv), 0)
        self.cb._check(d, err, "cuLaunchKernel")
        return out


# case -> (the function, products it computes)
CASES = {"gelu": ("lambda x, w, b: F.gelu(x @ w + b)", 1),
         # an epilogue of a few instructions an element: the template's products, nearly alone
         "relu": ("lambda x, w, b: torch.relu(x @ w + b)", 1), "swiglu": ("lambda x, w, b: F.silu(x @ w) * (x @ b)", 2),
         # a training forward's: the product is saved for the backward too (two stores an element)
         "gelu_saved": ("lambda x, w, b: (x @ w, F.gelu(x @ w + b))", 1)}


def main() -> None:
    from bench.common import interleaved_gpu_times, profiled_kernels, rel_error, table

    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x4096x4096")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--stages", default="6")
    p.add_argument("--check-only", action="store_true")
    p.add_argument("--tile-n", default="128", help="columns a consumer's tile: 128 or 192")
    p.add_argument("--cluster-modes", default="0", help="pairs of blocks: 0 none, 1, 2, 3 (see source())")
    p.add_argument("--template", default="",
                   help="ember's own kernel, fused under 'all', with codegen/cuda_matmul.py's NAME set to an int"
                        " VALUE for each NAME=VALUE given (STAGES=5,STAGES=6)")
    p.add_argument("--case", default="gelu", choices=CASES,
                   help="gelu(x @ W + b); silu(x @ Wg) * (x @ Wu) (two products); gelu_saved: gelu(x @ W + b)"
                        " and x @ W (a training forward's two stores). Hand-written kernels: gelu only")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    bf = torch.bfloat16
    text, products = CASES[a.case]
    fn = eval(text, {"F": F, "torch": torch})  # noqa: S307 -- a literal
    kernels = {f"{epi} s{s}{f' n{bn}' if bn != BN else ''}{f' cluster{mc}' if mc else ''}":
               HopperMatmul(int(s), epi, bn, mc)
               for s in a.stages.split(",") for epi in ("gelu", "none") for bn in map(int, a.tile_n.split(","))
               for mc in map(int, a.cluster_modes.split(","))} if a.case == "gelu" else {}
    checks = [(256, 128, 256), (200, 72, 136), (128, 4096, 384), (1000, 520, 264)]
    for M, K, N in checks:  # awkward edges first: partial tiles, a K tail
        torch.manual_seed(0)
        x, w, b = (torch.randn(M, K, device="cuda", dtype=bf), torch.randn(K, N, device="cuda", dtype=bf),
                   torch.randn(N, device="cuda", dtype=bf))
        for name, k in kernels.items():
            out = torch.full((M, N), float("nan"), device="cuda", dtype=bf)
            k(x, w, b, out)
            torch.cuda.synchronize()
            ref = fn(x.double(), w.double(), b.double()) if name.startswith("gelu") else x.double() @ w.double()
            print(f"check {M}x{K}x{N} {name}: rel err {rel_error(out, ref):.2e}, "
                  f"eager's {rel_error(fn(x, w, b) if name.startswith('gelu') else x @ w, ref):.2e}")
    if a.check_only:
        return
    # Every compiled variant is compiled afresh at each shape (static there, as a model of these
    # dims is), from a code object of its own: Dynamo keeps compiled frames per code object, and
    # would otherwise run one variant's graph for another, or turn later shapes dynamic.
    def fresh(**kwargs):
        return ember.compile(eval(text, {"F": F, "torch": torch}), **kwargs)  # noqa: S307

    from ember.codegen import cuda_matmul as codegen_matmul
    from ember.runtime import cuda_matmul as runtime_matmul
    torch._dynamo.config.recompile_limit = 256  # (the variants' frames are all Dynamo's one wrapper's)

    def patched(compiled, module, name, value):  # ``compiled`` with module.name = value around each call
        def call(*args):
            old = getattr(module, name)
            setattr(module, name, value)
            try:
                return compiled(*args)
            finally:
                setattr(module, name, old)
        return call

    for shape in a.shapes.split(","):
        M, K, N = map(int, shape.split("x"))
        ind = torch.compile(eval(text, {"F": F, "torch": torch}))  # noqa: S307
        ember_default = fresh()
        ember_cuda = fresh(options={"gpu_backend": "cuda"})
        # the fused Triton kernel the Hopper template replaces (built while the backend's check is faked)
        ember_triton = patched(fresh(options={"matmul_epilogues": "all"}), runtime_matmul, "on_hopper",
                               lambda kernel: False)
        ember_dynamic = fresh(dynamic=True)  # (int64 indices in the epilogue)
        forced = {f"ember, {v}": patched(fresh(options={"matmul_epilogues": "all"}), codegen_matmul, v.split("=")[0],
                                         int(v.split("=")[1])) for v in filter(None, a.template.split(","))}
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=bf) * 0.05
        w = torch.randn(K, N, device="cuda", dtype=bf) * 0.05
        b = torch.randn(N, device="cuda", dtype=bf) * 0.05 if products == 1 else torch.randn_like(w) * 0.05
        ref = fn(x.double(), w.double(), b.double())
        outs = {n: torch.empty(M, N, device="cuda", dtype=bf) for n in kernels}
        variants = {"Inductor": lambda: ind(x, w, b),
                    "cuBLAS mm alone": (lambda: x @ w) if products == 1 else (lambda: (x @ w, x @ b)),
                    "eager": lambda: fn(x, w, b), "ember (default)": lambda: ember_default(x, w, b),
                    "ember, Triton's fused kernel": lambda: ember_triton(x, w, b),
                    "ember, gpu_backend cuda": lambda: ember_cuda(x, w, b),
                    "ember, dynamic=True": lambda: ember_dynamic(x, w, b),
                    **{n: (lambda f=f: f(x, w, b)) for n, f in forced.items()}}
        for n, k in kernels.items():
            variants[n] = lambda k=k, o=outs[n]: k(x, w, b, o)
            variants[n]()
        torch.cuda.synchronize()
        for f in (ember_default, ember_cuda, ember_triton, ember_dynamic, *forced.values()):
            f(x, w, b)
        ember.wait_for_kernels()  # (Triton's matmul kernels compile in the background)
        errs = {"Inductor": rel_error(ind(x, w, b), ref), "eager": rel_error(fn(x, w, b), ref),
                "ember (default)": rel_error(ember_default(x, w, b), ref),
                "ember, Triton's fused kernel": rel_error(ember_triton(x, w, b), ref),
                "ember, gpu_backend cuda": rel_error(ember_cuda(x, w, b), ref),
                "ember, dynamic=True": rel_error(ember_dynamic(x, w, b), ref)}
        errs.update({n: rel_error(outs[n], ref) for n in kernels if n.startswith("gelu")})
        errs.update({n: rel_error(f(x, w, b), ref) for n, f in forced.items()})
        profiled = ["ember (default)", "ember, dynamic=True", "ember, Triton's fused kernel", "Inductor", *forced,
                    "cuBLAS mm alone", *(k for k in kernels if k.startswith("gelu"))]
        for n in profiled:
            kernels_us = profiled_kernels(variants[n], 10)
            print(f"{n}: GPU µs a call by kernel", {k[:60]: round(v, 1) for k, v in kernels_us.items()})
        times = interleaved_gpu_times(variants, rounds=a.rounds, rep_ms=30)
        rows = [(n, f"{ms * 1e3:.1f}", f"{2 * M * K * N * products / ms / 1e9:.0f}", f"{times['Inductor'] / ms:.3f}",
                 f"{errs.get(n, float('nan')):.1e}") for n, ms in sorted(times.items(), key=lambda kv: kv[1])]
        print(f"{text.split(': ')[1]} bf16 {M}x{K}x{N}, interleaved ({a.rounds} rounds)")
        print(table(rows, ["variant", "us", "TFLOP/s", "vs Inductor", "rel err"]))


if __name__ == "__main__":
    main()
