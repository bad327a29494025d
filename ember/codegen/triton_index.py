"""Index expressions for TritonKernelRenderer (codegen/triton.py): the IR's index over outer and
inner variables flattened to ``xindex``/``rindex`` where it is row-major (so Triton sees the
contiguity), index values kept in int32 where they provably fit, and loads' and stores' addresses
with their indirect variables bound. The attributes (``k``, ``kind``, ``name``) are the
renderer's."""

from __future__ import annotations

import sympy

from ..ir import shapes as sh
from ..schedule.kernel_ir import Value, inner_var, outer_var
from .triton_alu import pexpr


class TritonIndexing:
    """Index spellings of one kernel's Triton source; mixed into TritonKernelRenderer."""

    def index(self, e: sympy.Expr) -> str:
        return pexpr(self.flat(e), ("tl.maximum", "tl.minimum"))

    def index_as(self, e: sympy.Expr, dtype: str) -> str:
        """An index expression as a tensor of ``dtype``; a constant one (a replicate pad's
        clamped row) is a one-element tensor, not a Python int, which has no ``.to``."""
        if sympy.sympify(e).is_number:
            return f"tl.full([1], {int(e)}, {dtype})"
        return f"({self.index(e)}).to({dtype})"

    def index_value(self, e: sympy.Expr, dtype: str) -> str:
        """An index value (an arange's elements) as a tensor of ``dtype``. Index variables are
        int32 outside BIG kernels: a value that may leave int32's range (arange(2**31 - 2,
        2**31 + 3), a step of 2**30) is computed from int64 copies of its variables, which a
        wrapped int32 made negative and a literal past int32 failed to compile."""
        if sympy.sympify(e).is_number or self._fits_int32(e):
            return self.index_as(e, dtype)
        flat = self.flat(e)
        indices = {*(outer_var(i) for i in range(len(self.k.outer))),
                   *(inner_var(i) for i in range(len(self.k.inner))), *sympy.symbols("xindex rindex")}
        wide = {s: sympy.Symbol(f"{s.name}.to(tl.int64)" if s.name in {i.name for i in indices}
                                else f"tl.full([1], {s.name}, tl.int64)", integer=True,
                                nonnegative=s.is_nonnegative)
                for s in flat.free_symbols}
        return f"({pexpr(flat.xreplace(wide), ('tl.maximum', 'tl.minimum'))}).to({dtype})"

    def _fits_int32(self, e: sympy.Expr) -> bool:
        """Does every value of ``e``, a sum of multiples of index variables (each below its
        extent; a symbolic one below 2**31, or the kernel is BIG and its variables int64), lie in
        int32's range? (Wrapped partial sums are right when the total fits.)"""
        extents = {outer_var(i): n for i, n in enumerate(self.k.outer)}
        extents.update({inner_var(i): n for i, n in enumerate(self.k.inner)})
        low = high = 0
        for term, c in sympy.expand(e).as_coefficients_dict().items():
            if not c.is_Integer or abs(int(c)) >= 2**31 or term != 1 and term not in extents:
                return False
            if term == 1:
                largest = 1
            else:
                n = sh.static(extents[term])
                largest = 2**31 - 1 if n is None else max(n - 1, 0)
            low, high = low + min(0, int(c) * largest), high + max(0, int(c) * largest)
        return -2**31 <= low and high < 2**31

    def flat(self, e: sympy.Expr) -> sympy.Expr:
        """Rewrite c * (row-major index over the outer or inner dims) + rest as c * xindex + rest
        (or rindex): o1 + 4096*o0 is just xindex, and Triton only sees contiguity it can read."""
        e = sympy.expand(e)
        # (in tiles, xindex runs over the leading dims alone: the last is its own column index)
        outer = self.k.outer[:-1] if self.kind == "tiles" else self.k.outer
        for extents, var, flat_name in ((outer, outer_var, "xindex"), (self.k.inner, inner_var, "rindex")):
            n = len(extents)
            if n < 2:
                continue
            strides = sh.contiguous_strides(extents)
            c = e.coeff(var(n - 1))
            if c == 0 or c.has(*[var(i) for i in range(n)]):
                continue
            if all(sh.equal(e.coeff(var(i)), c * strides[i]) for i in range(n)):
                rest = e - sum((c * strides[i] * var(i) for i in range(n)), sympy.Integer(0))
                if not rest.has(*[var(i) for i in range(n)]):
                    e = sympy.expand(rest + c * sympy.Symbol(flat_name, integer=True, nonnegative=True))
        return e

    def bound_index(self, v: Value) -> sympy.Expr:
        """A load's or store's index with its indirect variables replaced by the index values
        (a store's first source is the value it stores)."""
        srcs = v.srcs[1:] if v.kind == "store" else v.srcs
        return v.arg.index.xreplace({sym: sympy.Symbol(self.name(src), integer=True)
                                     for sym, src in zip(v.arg.bindings, srcs)})

    def _pointer(self, v: Value) -> str:
        return f"{v.arg.buffer} + ({self.index(self.bound_index(v))})"
