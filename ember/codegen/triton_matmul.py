"""Triton: a matmul kernel and its epilogue (kernels with ``dot`` values, passes/matmul.py).

Each program walks BM x BN tiles of the (M, N) outer domain (persistent: a program per SM). For
each tile, a loop over K in steps of BK accumulates every dot of the kernel in float32 with
``tl.dot`` (two for silu(x @ Wg) * (x @ Wu), sharing the loads of x); then the epilogue (the
kernel's outer values: bias, gelu, the product of the two dots, casts) runs on the tile in
registers, and only the kernel's stores reach memory.

Programs take tiles in groups of GROUP_M tile rows, so programs running together share operand
tiles in L2; FLATTEN lets Triton pipeline the next tile's loads under the current one's epilogue
(faster for one matmul, slower for two: runtime/triton_matmul.py). Operands come in through
TMA descriptors (``TMA``, when the launcher finds them 16-byte aligned: the copy engine fills
shared memory and zero-fills past the edges) or through masked pointer loads (any layout).
"""

from __future__ import annotations

from typing import Any

import sympy

from ..ir import shapes as sh
from ..schedule.indexing import recombine
from ..schedule.kernel_ir import Kernel, Value, inner_var, outer_var
from .layout import operand_layout
from .triton import TritonKernelRenderer
from .triton_alu import TL_TYPES, RenderError
from .wrapper import pexpr

# the tile's rows (BM, 1) and columns (1, BN), as operand loads index them
_M, _N = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("am", "bn"))


def _layout(v: Value, row: sympy.Symbol, col: sympy.Symbol) -> tuple[str, sympy.Expr, sympy.Expr] | None:
    """``layout.operand_layout``; a RenderError for an operand indexed by the other's dim."""
    if sympy.expand(v.arg.index).free_symbols & {outer_var(0), outer_var(1), inner_var(0)} - {row, col}:
        raise RenderError("a matmul operand indexed by the other operand's dim")
    return operand_layout(v, row, col)


class MatmulRenderer(TritonKernelRenderer):
    def __init__(self, kernel: Kernel):
        super().__init__(kernel)
        if len(kernel.outer) != 2 or len(kernel.inner) != 1 or kernel.n_loops != 1:
            raise RenderError("a matmul kernel has outer (M, N) and one inner loop over K")
        self.m, self.n = (pexpr(e) for e in kernel.outer)
        self.kdim = pexpr(kernel.inner[0])
        # the operands: each load's side (A: (o0, r0), B: (r0, o1)) and memory layout
        self.sides: dict[int, str] = {}
        for d in kernel.dots:
            for v, side in zip(d.srcs, "ab"):
                if self.sides.setdefault(id(v), side) != side:
                    raise RenderError("one load as both operands of matmuls")
        self.operands = [v for v in kernel.values if id(v) in self.sides]
        self.layouts = {id(v): _layout(v, *((outer_var(0), inner_var(0)) if self.sides[id(v)] == "a"
                                              else (inner_var(0), outer_var(1))))
                        for v in self.operands}

    # epilogue values index the tile with o0 (BM, 1) and o1 (1, BN): no flattening of the two
    def flat(self, e: sympy.Expr) -> sympy.Expr:
        return recombine(e)  # (a (batch, token) point of the epilogue is the tile's row again)

    def mask_for(self, v: Value) -> str:
        return "xmask"

    @property
    def tma_ready(self) -> bool:
        return all(layout is not None for layout in self.layouts.values())

    def render(self) -> str:
        k = self.k
        params = [p.name for p in k.params] + [s.name for s in k.sizes]
        extra = ["BIG: tl.constexpr", "BM: tl.constexpr", "BN: tl.constexpr", "BK: tl.constexpr",
                 "GROUP_M: tl.constexpr", "TMA: tl.constexpr", "FLATTEN: tl.constexpr"]
        head = [f"# {k.name}: fuses {', '.join(k.origins) or '-'}",
                f"# outer {sh.fmt(k.outer)} in BM x BN tiles, inner {sh.fmt(k.inner)} in steps of BK: "
                f"{len(k.dots)} matmul(s) and their epilogue",
                "@triton.jit", f"def {k.name}({', '.join(params + extra)}):"]
        if self.tma_ready:
            self.emit("if TMA:")
            self.depth += 1
            self._descriptors()
            self.depth -= 1
        self.emit(f"tiles_n = tl.cdiv({self.n}, BN)")
        self.emit(f"tiles = tl.cdiv({self.m}, BM) * tiles_n")
        self.emit("# persistent: each program walks tiles; in groups of GROUP_M tile rows, so that programs")
        self.emit("# running together share operand tiles in L2")
        self.emit("for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):")
        self.depth += 1
        self.emit("in_group = GROUP_M * tiles_n")
        self.emit("first_m = (tile // in_group) * GROUP_M")
        self.emit(f"group_m = tl.minimum(tl.cdiv({self.m}, BM) - first_m, GROUP_M)")
        self.emit("tile_m = (first_m + (tile % in_group) % group_m).to(tl.int64 if BIG else tl.int32)")
        self.emit("tile_n = ((tile % in_group) // group_m).to(tl.int64 if BIG else tl.int32)")
        self.emit("am = tile_m * BM + tl.arange(0, BM)[:, None]")
        self.emit("bn = tile_n * BN + tl.arange(0, BN)[None, :]")
        for d in k.dots:
            self.emit(f"acc_{self.name(d)} = tl.zeros([BM, BN], tl.float32)")
        self._loop()
        self.emit(f"{outer_var(0).name} = am")
        self.emit(f"{outer_var(1).name} = bn")
        self.emit(f"xmask = (am < {self.m}) & (bn < {self.n})")
        for v in k.values:
            if v.kind == "dot":
                self.emit(f"{self.name(v)} = acc_{self.name(v)}")
            elif not v.inner:
                self.statements([v])
        return "\n".join(head + self.lines)

    def _descriptors(self) -> None:
        for v in self.operands:
            major, offset, stride = self.layouts[id(v)]
            a = self.sides[id(v)] == "a"
            rows, cols = (self.m, self.kdim) if a else (self.kdim, self.n)
            block = ("BM", "BK") if a else ("BK", "BN")
            if major == "col":  # the transpose is what is contiguous: describe that
                rows, cols, block = cols, rows, block[::-1]
            base = v.arg.buffer if offset == 0 else f"{v.arg.buffer} + {pexpr(offset)}"
            self.emit(f"desc_{self.name(v)} = tl.make_tensor_descriptor({base}, [{rows}, {cols}], "
                      f"[{pexpr(stride)}, 1], [{block[0]}, {block[1]}])")

    def _loop(self) -> None:
        self.emit(f"for k0 in range(0, {self.kdim}, BK):")
        self.depth += 1
        if self.tma_ready:
            self.emit("if TMA:  # the copy engine fills shared memory, zeros past the edges")
            self.depth += 1
            for v in self.operands:
                self.emit(f"{self.name(v)} = {self._tma_load(v)}")
            self.depth -= 1
            self.emit("else:")
            self.depth += 1
        self.emit("ka = k0 + tl.arange(0, BK)[None, :]")
        self.emit("kb = k0 + tl.arange(0, BK)[:, None]")
        for v in self.operands:
            self.emit(f"{self.name(v)} = {self._pointer_load(v)}")
        if self.tma_ready:
            self.depth -= 1
        for d in self.k.dots:
            a, b = (self.name(s) for s in d.srcs)
            self.emit(f"acc_{self.name(d)} = tl.dot({a}, {b}, acc_{self.name(d)})")
        self.depth -= 1

    def _tma_load(self, v: Value) -> str:
        major = self.layouts[id(v)][0]
        at = ["tile_m * BM", "k0"] if self.sides[id(v)] == "a" else ["k0", "tile_n * BN"]
        if major == "col":
            return f"desc_{self.name(v)}.load([{at[1]}, {at[0]}]).T"
        return f"desc_{self.name(v)}.load([{at[0]}, {at[1]}])"

    def _pointer_load(self, v: Value) -> str:
        if self.sides[id(v)] == "a":
            subs, mask = {outer_var(0): _M, inner_var(0): sympy.Symbol("ka")}, f"(am < {self.m}) & (ka < {self.kdim})"
        else:
            subs, mask = {inner_var(0): sympy.Symbol("kb"), outer_var(1): _N}, f"(kb < {self.kdim}) & (bn < {self.n})"
        index = pexpr(sympy.expand(v.arg.index).xreplace(subs), ("tl.maximum", "tl.minimum"))
        return f"tl.load({v.arg.buffer} + ({index}), mask={mask}, other=0.0)"


def operand_meta(renderer: MatmulRenderer) -> list[dict[str, Any]] | None:
    """What the launcher checks before it takes the TMA path: each operand's buffer, its element
    offset and its non-unit stride, all of which must be 16-byte aligned."""
    if not renderer.tma_ready:
        return None
    return [{"param": v.arg.buffer, "offset": pexpr(renderer.layouts[id(v)][1]),
             "stride": pexpr(renderer.layouts[id(v)][2]), "bytes": renderer.buffer_dtype[v.arg.buffer].itemsize}
            for v in renderer.operands]


def matmul_meta(kernel: Kernel) -> dict[str, Any]:
    renderer = MatmulRenderer(kernel)
    return {
        "kind": "matmul",
        "m": pexpr(kernel.outer[0]), "n": pexpr(kernel.outer[1]), "k": pexpr(kernel.inner[0]),
        "sizes": [s.name for s in kernel.sizes],
        "params": [p.name for p in kernel.params],
        "dots": len(kernel.dots),
        "operand_dtype": TL_TYPES[kernel.dots[0].srcs[0].dtype],
        "tma": operand_meta(renderer),
    }
