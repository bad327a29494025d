"""CUDA C++ for Hopper: one matmul (or two sharing A) and its epilogue as a warp-specialized
ping-pong kernel.

Triton's fused matmul computes the epilogue (bias, gelu, casts) while the tensor cores wait,
which cost it 3-4% against cuBLAS plus a separate epilogue kernel at the suite's shape
(bench/RESULTS.md). This kernel has the shape of cuBLAS's ping-pong kernels (faster than
Triton's fused kernel in 6 of 8 comparisons; with a light epilogue it runs 12% behind cuBLAS's
products alone, its tensor cores idle 13% of the time where cuBLAS's idle 4%, the consumers
waiting for stages):

* a block per SM (persistent) of three warp groups. The producer (one thread of warp group 0)
  loads operand tiles with TMA into a ring of shared-memory stages, the copy engine zero-filling
  past the edges; mbarriers say when a stage is full and when it is free again.
* the two consumer warp groups own alternate 128 x 128 output tiles. Each sums its tile over K
  with wgmma (two m64n128k16 products per 16-deep step, float32 accumulators in registers) and
  then runs the epilogue on its registers while the other consumer's products run: an order
  barrier hands the tensor cores from one consumer to the other as a mainloop ends. (Both
  consumers on one 256 x 128 tile, sharing B, were slower: the epilogue then stalls the
  tensor cores, and the products were not faster either; bench/RESULTS.md.)
* the epilogue is the kernel IR's own outer values, rendered per element by the C-style renderer
  the other CUDA kernels use (codegen/cstyle.py), with the product in place of the dot value.
* two products sharing A (silu(x @ Wg) * (x @ Wu)) are one 128-wide product: a stage holds 64
  columns of each B side by side, so the epilogue finds both products of an element in one
  thread's accumulators, 64 columns apart; an output tile is 128 x 64.

Operands: A (M, K) with K contiguous or M contiguous, B (K, N) with N contiguous or K contiguous
(``x @ W`` and ``F.linear``'s ``x @ W.T``), 16-bit floats, 16-byte aligned rows; the launcher
(runtime/cuda_matmul.py) checks those at each call and sends other calls through ATen. Built for
sm_90a (wgmma and setmaxnreg exist only there).
"""

from __future__ import annotations

import re
from typing import Any

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .cexpr import index_expr
from .cstyle import BodyRenderer
from .cuda import CUDA
from .cuda_prelude import PRELUDE
from .layout import operand_layout
from .wrapper import pexpr

# 128 x 192 tiles read a third less of A per product: in ember's generated kernel that was 0.4-3.9%
# faster with a light epilogue (gelu(x @ W + b) at K = 4096 on an H200), 13% slower at K = 2048,
# 9-14% slower with int64 indices, and 28-31% slower where a training forward also stores the
# product (570 against 435 µs at 8192 x 4096 x 4096, no spills; cause not found;
# bench/RESULTS.md, thirty-fourth-run session): the template keeps 128 columns
BM, BN, BK = 128, 128, 64
STAGE_BYTES = (BM + BN) * BK * 2
# 4 x 32 KiB. H200, gelu(x @ W + b) at 8192 x 4096 x 4096, profiled: 4 stages 388 µs, 5 stages 376,
# 6 stages 377, where interleaved calls (L2 flushed) ordered them the other way, 412 / 424 / 430
# (bench/RESULTS.md, fifty-sixth-run session)
STAGES = 4
THREADS = 384         # a producer and two consumer warp groups
CONSUMER_REGISTERS = 232  # setmaxnreg: 2 x 128 x 232 + 128 x 40 <= 64K registers
PRODUCER_REGISTERS = 40
ARCH = "sm_90a"
_WGMMA_TYPE = {dt.bfloat16: "bf16", dt.float16: "f16"}


def smem_bytes() -> int:
    """Dynamic shared memory: 1 KiB to align the ring, the stages, the full / empty / order mbarriers."""
    return 1024 + STAGES * STAGE_BYTES + (2 * STAGES + 2) * 8


class MatmulRenderError(ValueError):
    """The kernel is not one this template computes (its caller renders it otherwise)."""


def _layout(v: Value, row: sympy.Symbol, col: sympy.Symbol) -> tuple[str, sympy.Expr, sympy.Expr] | None:
    """``layout.operand_layout``, None also for an operand indexed by the other's dim."""
    if sympy.expand(v.arg.index).free_symbols & {outer_var(0), outer_var(1), inner_var(0)} - {row, col}:
        return None
    return operand_layout(v, row, col)


def takes(kernel: Kernel) -> str | None:
    """None when the template computes ``kernel``, else why not."""
    if len(kernel.outer) != 2 or len(kernel.inner) != 1 or kernel.n_loops != 1:
        return "not a matmul kernel: outer (M, N), one inner loop over K"
    if len(kernel.dots) not in (1, 2):
        return f"{len(kernel.dots)} matmuls in one kernel (the template computes one, or two sharing A)"
    if kernel.device_sizes:
        return "sizes read on the device"
    a = kernel.dots[0].srcs[0]
    bs = [d.srcs[1] for d in kernel.dots]
    if any(d.srcs[0] is not a for d in kernel.dots):
        return "two matmuls that do not share their first operand"
    if any(s.kind != "load" for s in (a, *bs)) or a.dtype not in _WGMMA_TYPE or any(b.dtype != a.dtype for b in bs):
        return "operands that are not 16-bit float loads"
    if any(v.inner and v not in kernel.dots and v is not a and all(v is not b for b in bs) for v in kernel.values):
        return "work in the K loop besides the products"
    layouts = [_layout(b, inner_var(0), outer_var(1)) for b in bs]
    if _layout(a, outer_var(0), inner_var(0)) is None or None in layouts:
        return "an operand with no contiguous dim"
    if len({major for major, _, _ in layouts}) > 1:  # (one descriptor reads both B tiles)
        return "second operands of two layouts"
    return None


def hopper_helpers() -> str:
    """The device helpers a translation unit of these kernels needs after the CUDA prelude:
    TMA loads, mbarriers, shared-memory descriptors and the wgmma products of each layout."""
    acc = ", ".join(f"%{i}" for i in range(BN // 2))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(BN // 2))
    products = []
    for name in ("bf16", "f16"):
        for ta in (0, 1):
            for tb in (0, 1):
                products.append(
                    f"template <> EMBER_FN void ember_wgmma<{ta}, {tb}>(float* d, uint64_t da, uint64_t db, int acc,"
                    f" ember_{name}_tag) {{\n"
                    f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{BN // 2 + 2}, 0;\\n"\n'
                    f'               "wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{name}.{name} {{{acc}}},"\n'
                    f'               " %{BN // 2}, %{BN // 2 + 1}, p, 1, 1, {ta}, {tb};\\n}}\\n"\n'
                    f"               : {outs}\n"
                    f'               : "l"(da), "l"(db), "r"(acc));\n}}')
    return _HELPERS + "\n".join(products) + "\n"


_HELPERS = r"""
// ---- Hopper matmuls: TMA, mbarriers, wgmma (codegen/cuda_matmul.py) ----
struct __align__(64) EmberTensorMap { uint64_t opaque[16]; };  // a CUtensorMap, made by the host
struct ember_bf16_tag {};
struct ember_f16_tag {};
EMBER_FN uint32_t ember_smem(const void* p) {
  uint32_t r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
EMBER_FN void ember_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
EMBER_FN void ember_mbar_expect(uint32_t bar, uint32_t bytes) {  // arrive, and the bytes TMA will bring
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
EMBER_FN void ember_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
EMBER_FN void ember_mbar_wait(uint32_t bar, uint32_t parity) {  // until the phase of this parity completes
  asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT;\n}\n" :: "r"(bar), "r"(parity) : "memory");
}
EMBER_FN void ember_tma_load(uint32_t dst, const EmberTensorMap* map, uint32_t bar, int inner, int outer) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%3, %4}], [%2];"
               :: "r"(dst), "l"((uint64_t)map), "r"(bar), "r"(inner), "r"(outer) : "memory");
}
// a shared-memory matrix descriptor for 128-byte-swizzled tiles (the swizzle TMA writes)
EMBER_FN uint64_t ember_smem_desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(leading >> 4) << 16)
       | ((uint64_t)(stride >> 4) << 32) | (1ull << 62);
}
EMBER_FN uint64_t ember_desc_add(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
EMBER_FN void ember_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
EMBER_FN void ember_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> EMBER_FN void ember_wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
}
EMBER_FN void ember_keep(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
// two adjacent elements: one store of both where both are in bounds and the pair is aligned
template <typename S> EMBER_FN void ember_store_pair(S* p, const S* v, bool first, bool second) {
  struct __align__(2 * sizeof(S)) Pair { S x, y; };
  // three stores under predicates, no branch around the two single ones: the branches (one per
  // pair, 55 in a tile's epilogue) cut the epilogue into blocks the compiler scheduled apart
  const bool both = first && second && ((uint64_t)p & (2 * sizeof(S) - 1)) == 0;
  if (both) *(Pair*)p = Pair{v[0], v[1]};
  if (!both && first) p[0] = v[0];
  if (!both && second) p[1] = v[1];
}
EMBER_FN void ember_tile_of(int t, int tiles_m, int tiles_n, int& pm, int& pn) {
  // groups of 8 tile rows: blocks running together share operand tiles in L2
  int in_group = 8 * tiles_n, first_m = (t / in_group) * 8;
  int size_m = tiles_m - first_m < 8 ? tiles_m - first_m : 8;
  pm = first_m + (t % in_group) % size_m;
  pn = (t % in_group) / size_m;
}
// one 64 x BN x 16 product: A and B from shared memory; TA / TB: A M-major / B N-major
template <int TA, int TB, typename T> EMBER_FN void ember_wgmma(float* d, uint64_t da, uint64_t db, int acc, T);
"""


class CudaMatmulRenderer:
    """Renders a kernel of one matmul, or of two sharing A (``takes(kernel) is None``), as the
    ping-pong template. Two products (a gated MLP's silu(x @ Wg) * (x @ Wu)) are one: the B
    tile of a stage is 64 columns of each second operand side by side, so each wgmma computes
    64 columns of both products, and a tile of the output is 64 columns wide."""

    def __init__(self, kernel: Kernel):
        why = takes(kernel)
        if why is not None:
            raise MatmulRenderError(f"{kernel.name}: {why}")
        self.k = kernel
        self.body = BodyRenderer(kernel, CUDA)
        self.dots = kernel.dots
        self.a = self.dots[0].srcs[0]
        self.bs = [d.srcs[1] for d in self.dots]
        self.cols = BN // len(self.dots)  # the output's columns a tile
        self.a_layout = _layout(self.a, outer_var(0), inner_var(0))
        self.b_layouts = [_layout(b, inner_var(0), outer_var(1)) for b in self.bs]
        self.m, self.n, self.kdim = kernel.outer[0], kernel.outer[1], kernel.inner[0]

    @property
    def a_m_major(self) -> bool:
        return self.a_layout[0] == "col"

    @property
    def b_n_major(self) -> bool:
        return self.b_layouts[0][0] == "row"

    def maps(self) -> list[str]:
        """The tensor-map parameters: A's, then each product's B."""
        return ["a_map", "b_map", *(f"b{i}_map" for i in range(1, len(self.bs)))]

    def params(self) -> list[str]:
        out = []
        for p in self.k.params:
            const = "" if p.is_output else "const "
            out.append(f"{const}{CUDA.storage[p.dtype]}* {CUDA.restrict} {p.name}")
        return out + [f"{sh.size_ctype(s)} {s.name}" for s in self.k.sizes]

    def _loads(self) -> list[str]:
        """The producer's TMA loads of K block kb into stage ``stage`` (A, then B)."""
        lines = []
        if self.a_m_major:  # boxes of 64 rows (M) x 64 K: one per m64 half
            lines += ["ember_tma_load(stage, &a_map, full, pm * 128, kb * 64);",
                      "ember_tma_load(stage + 8192, &a_map, full, pm * 128 + 64, kb * 64);"]
        else:  # one box of 128 rows (M) x 64 K
            lines += ["ember_tma_load(stage, &a_map, full, kb * 64, pm * 128);"]
        if len(self.bs) > 1:  # 64 columns (N) x 64 K of each product's B, side by side
            for i, b_map in enumerate(self.maps()[1:]):
                at = "pn * 64, kb * 64" if self.b_n_major else "kb * 64, pn * 64"
                lines.append(f"ember_tma_load(stage + {16384 + 8192 * i}, &{b_map}, full, {at});")
        elif self.b_n_major:  # boxes of 64 K rows x 64 columns (N)
            lines += [f"ember_tma_load(stage + {16384 + 8192 * i}, &b_map, full, pn * {BN} + {64 * i}, kb * 64);"
                      for i in range(BN // 64)]
        else:  # one box of BN columns (N) x 64 K
            lines += [f"ember_tma_load(stage + 16384, &b_map, full, kb * 64, pn * {BN});"]
        return lines

    def _descriptors(self) -> list[str]:
        """Descriptors of the 16-deep slice kk: ``da0`` / ``da1`` the two m64 halves of A, ``db``.
        ``a`` and ``b`` are the stage's byte offsets in the ring, added to a descriptor of the ring:
        the start address is the descriptor's low bits, and the ring stays below 2^18 bytes."""
        if self.a_m_major:  # 64 K rows of 128 bytes (M) per half; a slice is 16 rows further
            a0 = "ember_desc_add(ember_desc_mn, a + kk * 2048)"
            a1 = "ember_desc_add(ember_desc_mn, a + 8192 + kk * 2048)"
        else:  # 128 M rows of 128 bytes (K); a slice is 32 bytes further along the row
            a0, a1 = "ember_desc_add(ember_desc_k, a + kk * 32)", "ember_desc_add(ember_desc_k, a + 8192 + kk * 32)"
        b = ("ember_desc_add(ember_desc_mn, b + kk * 2048)" if self.b_n_major
             else "ember_desc_add(ember_desc_k, b + kk * 32)")
        return [f"const uint64_t da0 = {a0}, da1 = {a1}, db = {b};"]

    def _descriptor_bases(self) -> list[str]:
        """The ring's descriptors that the slices' descriptors offset: for K-major tiles (rows of
        128 bytes along K) and for M- or N-major ones (64 K rows of 128 bytes)."""
        text = "\n".join(self._descriptors())
        return [f"const uint64_t {name} = ember_smem_desc(ring, {leading}, 1024);"
                for name, leading in (("ember_desc_k", 16), ("ember_desc_mn", 8192)) if name in text]

    def index_type(self) -> str:
        """int32_t for the epilogue's rows, columns and element indices when the sizes are static
        and every index the epilogue computes stays below 2^31 (fewer instructions per element
        in the epilogue, which has to fit under the other consumer's products), else int64_t."""
        m, n = sh.static(self.m), sh.static(self.n)
        if m is None or n is None:
            return "int64_t"
        corner = {outer_var(0): max(m - 1, 0), outer_var(1): max(n - 1, 0)}
        for v in self.k.values:
            if v.inner or v.kind not in ("load", "store") or v.arg.bindings:
                continue
            e = sympy.expand(v.arg.index)
            if e.free_symbols - {outer_var(0), outer_var(1)}:
                return "int64_t"
            if any(c < 0 for c in e.as_coefficients_dict().values()) or e.xreplace(corner) >= 2**31:
                return "int64_t"
        return "int32_t"

    def _paired_stores(self) -> list[Value]:
        """Stores whose elements at columns c and c + 1 are adjacent in memory: each pair of
        accumulator elements stores them together (one 4-byte store of two 16-bit values)."""
        return [v for v in self.k.values
                if v.kind == "store" and not v.inner and not v.arg.accumulate and not v.arg.bindings
                and v.srcs[0].kind != "chunksum" and sympy.expand(v.arg.index).coeff(outer_var(1)) == 1]

    def _epilogue(self) -> tuple[list[str], list[str], list[str]]:
        """(before, per element, after) a pair of accumulator elements: the pairs' staging
        registers, the kernel's outer values for one element (``o0`` / ``o1`` its row and column,
        the dot value its float32 sum; paired stores go to staging), and the pairs' stores."""
        paired = self._paired_stores()
        before, after = [], []
        row, col = sympy.Symbol("ember_row", integer=True), sympy.Symbol("ember_col", integer=True)
        for j, v in enumerate(paired):
            storage = CUDA.storage[self.body.buffer_dtype[v.arg.buffer]]
            before.append(f"{storage} ember_pair{j}[2];")
            self.body.vector_access[id(v)] = f"ember_pair{j}[p]"
            at = index_expr(sympy.expand(v.arg.index).xreplace({outer_var(0): row, outer_var(1): col}))
            after.append(f"ember_store_pair(&{v.arg.buffer}[{at}], ember_pair{j}, in_rows && ember_col < (@I@)N, "
                         "in_rows && ember_col + 1 < (@I@)N);")
        values = [v for v in self.k.values if not v.inner and v not in self.dots]
        # product i's element: 64 i columns further along the accumulators (two products)
        sums = [f"const float {self.body.name(d)} = acc[h][e{f' + {i * self.cols // 2}' if i else ''} + p];"
                for i, d in enumerate(self.dots)]
        o0, o1 = outer_var(0).name, outer_var(1).name
        if all(id(v) in self.body.vector_access for v in values if v.kind == "store"):
            # every store waits for the pair: compute both elements unguarded (no branch between
            # them, so their math interleaves), at a row and column kept inside the tensor
            body = self.body.statements(values)
            text = "\n".join(body)
            head = [line for name, line in (
                (o0, f"const @I@ {o0} = in_rows ? ember_row : (@I@)M - 1;"),
                (o1, f"const @I@ {o1} = ember_col + p < (@I@)N ? ember_col + p : (@I@)N - 1;"))
                if re.search(rf"\b{name}\b", text)]  # (the ones the epilogue reads)
            return before, [*head, *sums, *body], after
        guarded = [f"const @I@ {o0} = ember_row, {o1} = ember_col + p;", f"if (in_rows && {o1} < (@I@)N) {{",
                   *("  " + line for line in sums),
                   *("  " + line for line in self.body.statements(values)), "}"]
        return before, guarded, after

    def render(self) -> str:
        k = self.k
        ta, tb = int(self.a_m_major), int(self.b_n_major)
        tag = f"ember_{_WGMMA_TYPE[self.a.dtype]}_tag()"
        m, n, kdim = (index_expr(e) for e in (self.m, self.n, self.kdim))
        index = self.index_type()
        before, per_element, after = self._epilogue()
        text = _KERNEL
        for key, value in {
            "@NAME@": k.name, "@ORIGINS@": ", ".join(k.origins) or "-", "@OUTER@": sh.fmt(k.outer),
            "@MAPS@": ", ".join(f"const __grid_constant__ EmberTensorMap {m}" for m in self.maps()),
            "@TILE@": f"128 x {self.cols}" + (f" (64 columns of each of {len(self.dots)} products)"
                                               if len(self.dots) > 1 else ""),
            "@INNER@": sh.fmt(k.inner), "@PARAMS@": ", ".join(self.params()),
            "@M@": m, "@N@": n, "@K@": kdim, "@STAGES@": str(STAGES),
            "@LAYOUT@": f"A {'M' if ta else 'K'}-major, B {'N' if tb else 'K'}-major",
            "@PRODUCER_REGS@": str(PRODUCER_REGISTERS), "@CONSUMER_REGS@": str(CONSUMER_REGISTERS),
            "@LOADS@": "\n".join("        " + line for line in self._loads()),
            "@DESCRIPTORS@": "\n".join("        " + line for line in self._descriptors()),
            "@DESC_BASES@": "\n".join("  " + line for line in self._descriptor_bases()),
            "@WGMMA0@": f"ember_wgmma<{ta}, {tb}>(acc[0], da0, db, kb | kk, {tag});",
            "@WGMMA1@": f"ember_wgmma<{ta}, {tb}>(acc[1], da1, db, kb | kk, {tag});",
            "@PAIRS@": "\n".join("          " + line for line in before),
            "@EPILOGUE@": "\n".join("            " + line for line in per_element),
            "@PAIR_STORES@": "\n".join("          " + line for line in after),
        }.items():
            text = text.replace(key, value)
        return (text.replace("@I@", index).replace("@BN@", str(BN)).replace("@COLS@", str(self.cols))
                .replace("@STAGE_BYTES@", str(STAGE_BYTES)))


_KERNEL = r"""// @NAME@: fuses @ORIGINS@
// outer @OUTER@ in @TILE@ tiles, inner @INNER@ in steps of 64 (@LAYOUT@): a Hopper ping-pong
// kernel. Warp group 0 loads tiles with TMA into @STAGES@ shared-memory stages; warp groups 1 and 2
// take alternate tiles, sum them with wgmma, and run the epilogue while the other one's products run.
extern "C" __global__ void __launch_bounds__(384, 1)
@NAME@(@MAPS@, @PARAMS@) {
  extern __shared__ unsigned char ember_smem_raw[];
  const uint32_t ring = (ember_smem(ember_smem_raw) + 1023) & ~1023u;  // 128-byte swizzles need 1 KiB alignment
  const uint32_t bars = ring + @STAGES@ * @STAGE_BYTES@;  // full[stage], empty[stage], order[consumer]
  // (the warp group through a shuffle: the compiler then knows that it is the same across a warp,
  // and keeps the stage and descriptor arithmetic in uniform registers, where wgmma reads them:
  // 57 instructions a stage where vector registers took 117, bench/RESULTS.md)
  const int group = __shfl_sync(0xffffffff, (int)threadIdx.x / 128, 0), t = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < @STAGES@; ++s) {
      ember_mbar_init(bars + 8 * s, 1);
      ember_mbar_init(bars + 8 * (@STAGES@ + s), 1);
    }
    ember_mbar_init(bars + 8 * (2 * @STAGES@), 1);
    ember_mbar_init(bars + 8 * (2 * @STAGES@ + 1), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t M = @M@, N = @N@, K = @K@;
  const int tiles_m = (int)((M + 127) / 128), tiles_n = (int)((N + @COLS@ - 1) / @COLS@), tiles = tiles_m * tiles_n;
  const int k_blocks = (int)((K + 63) / 64);
  const int mine = tiles > (int)blockIdx.x ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
  if (group == 0) {  // the producer: one thread loads every stage, in the order the consumers take them
    asm volatile("setmaxnreg.dec.sync.aligned.u32 @PRODUCER_REGS@;");
    if (t != 0) return;
    for (int i = 0; i < mine; ++i) {
      int pm, pn;
      ember_tile_of(blockIdx.x + i * gridDim.x, tiles_m, tiles_n, pm, pn);
      for (int kb = 0; kb < k_blocks; ++kb) {
        const int n = i * k_blocks + kb, s = n % @STAGES@;
        if (n >= @STAGES@) ember_mbar_wait(bars + 8 * (@STAGES@ + s), ((n / @STAGES@) - 1) & 1);  // stage free
        const uint32_t full = bars + 8 * s, stage = ring + s * @STAGE_BYTES@;
        ember_mbar_expect(full, @STAGE_BYTES@);
@LOADS@
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 @CONSUMER_REGS@;");
  const int c = group - 1, warp = t / 32, lane = t % 32;
@DESC_BASES@
  float acc[2][@BN@ / 2];
  for (int j = 0; 2 * j + c < mine; ++j) {  // this consumer's tiles: the block's i = 2j + c
    const int i = 2 * j + c;
    if (i > 0) ember_mbar_wait(bars + 8 * (2 * @STAGES@ + c), (c ? j : j - 1) & 1);  // the other's products issued
    int pm, pn;
    ember_tile_of(blockIdx.x + i * gridDim.x, tiles_m, tiles_n, pm, pn);
    // (the first product overwrites these; zeroing them tells the compiler that the last tile's
    // accumulators are dead once its epilogue has read them, which frees their registers for
    // the epilogue: an epilogue beside 192 accumulators spilled without it)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < @BN@ / 2; ++e) acc[h][e] = 0.0f;
    for (int kb = 0; kb < k_blocks; ++kb) {
      const int n = i * k_blocks + kb, s = n % @STAGES@;
      ember_mbar_wait(bars + 8 * s, (n / @STAGES@) & 1);  // stage full
      const uint32_t a = s * @STAGE_BYTES@, b = a + 16384;  // (offsets in the ring)
      ember_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
@DESCRIPTORS@
        @WGMMA0@
        @WGMMA1@
      }
      ember_wgmma_commit();
      if (kb > 0) {  // the previous stage's products are done: free it
        ember_wgmma_wait<1>();
        if (t == 0) ember_mbar_arrive(bars + 8 * (@STAGES@ + (n - 1) % @STAGES@));
      }
    }
    if (t == 0) ember_mbar_arrive(bars + 8 * (2 * @STAGES@ + 1 - c));  // the other consumer's turn
    ember_wgmma_wait<0>();
    if (t == 0 && k_blocks > 0) ember_mbar_arrive(bars + 8 * (@STAGES@ + (i * k_blocks + k_blocks - 1) % @STAGES@));
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < @BN@ / 2; ++e) ember_keep(acc[h][e]);
    // the epilogue (@I@ indices): acc[h][e] is row 64 h + 16 warp + lane / 4 + 8 ((e / 2) % 2),
    // column 8 (e / 4) + 2 (lane % 4) + e % 2 of the products (wgmma's accumulator layout). A
    // column pair's four row pairs come one after another, so that what the epilogue reads per
    // column (a bias) is loaded once for them: in the other order its loads stalled the epilogue
#pragma unroll
    for (int q = 0; q < @COLS@ / 8; ++q) {  // 8 columns of the tile at a time
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {  // a pair of adjacent columns at a time
          const int e = 4 * q + 2 * half;
          const @I@ ember_row = (@I@)pm * 128 + 64 * h + 16 * warp + lane / 4 + 8 * half;
          const @I@ ember_col = (@I@)pn * @COLS@ + 8 * q + 2 * (lane % 4);
          const bool in_rows = ember_row < (@I@)M;
@PAIRS@
#pragma unroll
          for (int p = 0; p < 2; ++p) {
@EPILOGUE@
          }
@PAIR_STORES@
        }
      }
    }
  }
}
"""


def render_kernel(kernel: Kernel) -> str:
    return CudaMatmulRenderer(kernel).render()


def render_module(kernels: list[Kernel]) -> str:
    """One translation unit of matmul kernels, for sm_90a."""
    return PRELUDE + hopper_helpers() + "\n" + "\n\n".join(render_kernel(k) for k in kernels) + "\n"


def launch_meta(kernel: Kernel) -> dict[str, Any]:
    """What the launcher needs: M, N, K and each operand's buffer, element offset, dims and the
    stride of its outer dim, as Python expressions of the size symbols (the tensor maps)."""
    r = CudaMatmulRenderer(kernel)
    operands = []
    for v, (major, offset, stride), rows, cols in ((r.a, r.a_layout, r.m, r.kdim),
                                                   *((b, layout, r.kdim, r.n) for b, layout in zip(r.bs, r.b_layouts))):
        if major == "col":  # the transpose is what is contiguous: describe that
            rows, cols = cols, rows
        if v is r.a:
            box = (64, 64) if r.a_m_major else (64, BM)
        else:  # (a tile's columns of it: all BN, or 64 of each of two products)
            box = (64, 64) if r.b_n_major else (64, r.cols)
        operands.append({"param": v.arg.buffer, "offset": pexpr(offset), "stride": pexpr(stride),
                         "rows": pexpr(rows), "cols": pexpr(cols), "box": box})
    return {
        "kind": "hopper_matmul",
        "m": pexpr(r.m), "n": pexpr(r.n), "k": pexpr(r.kdim),
        "sizes": [s.name for s in kernel.sizes],
        "params": [p.name for p in kernel.params],
        "float_sizes": [sh.is_float_symbol(s) for s in kernel.sizes],
        "dtype": "bfloat16" if r.a.dtype == dt.bfloat16 else "float16",
        "operands": operands,
        "threads": THREADS, "smem": smem_bytes(), "tile": (BM, r.cols),
    }
