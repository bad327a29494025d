"""Pointwise kernels' loops, for CppKernelRenderer (codegen/cpp.py): invariants computed once
before the loops, a parallel for over the outer dims and a simd loop over the last, split where a
guard's truth changes at a bound or unswitched on a uniform one (padding skipped), or in three
around a window where every guard holds (cpp_split.py). The attributes and helpers (``k``,
``body``, ``emit``, ``_statements``, the loop openers) are the renderer's."""

from __future__ import annotations

import sympy

from ..ir import shapes as sh
from ..ir.ops import Op
from ..schedule.kernel_ir import Value, outer_var, reachable
from .cexpr import index_expr
from .cpp_split import Window, find_split, find_window, loop_invariants, row_invariants, uniform_selects
from .cpp_staging import close_strip, open_strip, staged_accesses

# Work (elements of a simple kernel) below which a kernel runs on one thread: waking the pool
# costs more. Kernels that do more per element count as more elements (``cost_per_element``).
PARALLEL_THRESHOLD = 32768
# sin, cos and tan whose arguments in a loop are all below 2^26 in magnitude: 2/pi's first bits as
# constants, the bits the full reduction cuts out for them too (so the same results), in half the
# time (codegen/cpp_math.py). A loop computing them runs a check of its arguments first.
NEAR_TRIG = {Op.SIN: "ember_sin_near({})", Op.COS: "ember_cos_near({})", Op.TAN: "ember_tan_near({})"}
NEAR_BLOCK = 4096  # elements a thread checks, then computes, at a time (a flat loop's blocks)


class PointwiseLoops:
    """The loops of a kernel with no inner domain; mixed into CppKernelRenderer."""

    def _pointwise(self) -> None:
        k = self.k
        values = [v for v in k.values]
        n = len(k.outer)
        if n == 0:
            self._statements(values)
            return
        once = [v for v in loop_invariants(values) if v.kind != "const"]
        if once:  # (loads among them read an element only where the loops have one)
            nonempty = (sh.static(sh.numel(k.outer)) or 0) > 0
            if not nonempty:
                self.emit(f"if ({index_expr(sh.numel(k.outer))} > 0) {{")
                self.depth += 1
            self.emit("// the same at every element: computed once, before the loops")
            hoisted = {id(v) for v in once}
            hoisted |= {id(s) for v in once for s in v.srcs}  # (their constants)
            self._statements([v for v in values if id(v) in hoisted])
            values = [v for v in values if id(v) not in hoisted]
            self._pointwise_loops(values)
            if not nonempty:
                self.depth -= 1
                self.emit("}")
            return
        self._pointwise_loops(values)

    def _pointwise_loops(self, values: list[Value]) -> None:
        k = self.k
        n = len(k.outer)
        work = index_expr(sh.numel(k.outer) * self.cost)
        var, extent = outer_var(n - 1), index_expr(k.outer[-1])
        if n == 1:
            simd = "" if staged_accesses(self, values, var) else " simd"
            self._pointwise_loop(var, "0", extent, values,
                                 f"#pragma omp parallel for{simd} schedule(static) if({work} >= {PARALLEL_THRESHOLD})")
            return
        collapse = f" collapse({n - 1})" if n > 2 else ""
        self.emit(f"#pragma omp parallel for{collapse} schedule(static) if({work} >= {PARALLEL_THRESHOLD})")
        self._open_loops(outer_var, k.outer[:-1])
        split = None if self.scalar or sh.static(k.outer[-1]) == 0 else find_split(values, var)
        # (a split at a bound skips the false side's work too; an unswitch on one uniform guard
        # gives way to a window over positions, whose interior has every guard of the loop constant)
        window = (None if self.scalar or sh.static(k.outer[-1]) == 0 or split is not None and split.bound is not None
                  else find_window(values, var))
        if window is not None and split is not None and not window.positional:
            window = None
        if window is not None:
            self._window_loops(var, extent, values, window)
        elif split is None:
            hoisted = row_invariants(values, var)
            opened = any(v.kind != "const" for v in hoisted) and sh.static(k.outer[-1]) is None
            if opened:  # (their loads read an element only where the row has one)
                self.emit(f"if ({extent} > 0) {{")
                self.depth += 1
            values = self._hoist(values, hoisted, var)
            self._pointwise_loop(var, "0", extent, values, "")
            self._close_loops(int(opened))
        else:  # padding skipped: the loop in two at the guard's bound, or unswitched (cpp_split.py)
            positive = sh.static(k.outer[-1])
            if positive is None:  # (the bound's index checks run only where the row has elements)
                self.emit(f"if ({extent} > 0) {{")
                self.depth += 1
            self._statements(split.hoisted)
            inside = [v for v in values if v not in split.hoisted]
            inside = self._hoist(inside, row_invariants(inside, var, frozenset({id(split.guard)})), var)
            guard = id(split.guard)
            if split.bound is None:
                self.emit(f"if ({self.body.expression(split.guard)}) {{  // {self.body.name(split.guard)}, "
                          f"the same along {var.name}")
                for truth in ("true", "false"):
                    self.depth += 1
                    self.body.constants[guard] = truth
                    self._pointwise_loop(var, "0", extent, inside, "")
                    self.depth -= 1
                    self.emit("} else {" if truth == "true" else "}")
            else:
                bound = f"{self.body.name(split.bound)}{' + 1' if split.inclusive else ''}"
                self.emit(f"// {self.body.name(split.guard)} is {str(split.below).lower()} for {var.name} below "
                          f"{bound}, {str(not split.below).lower()} from there on")
                self.emit(f"const int64_t {var.name}_split = std::min<int64_t>(std::max<int64_t>({bound}, 0), "
                          f"{extent});")
                for start, stop, truth in (("0", f"{var.name}_split", split.below),
                                           (f"{var.name}_split", extent, not split.below)):
                    self.body.constants[guard] = str(truth).lower()
                    self._pointwise_loop(var, start, stop, inside, "")
            del self.body.constants[guard]
            self._close_loops(positive is None)
        self._close_loops(n - 1)

    def _window_loops(self, var: sympy.Symbol, extent: str, values: list[Value], window: Window) -> None:
        """The loop over ``var`` in three (cpp_split.find_window): up to where every affine bound of
        its guards holds, the middle with those guards the constant true (no branches: the simd
        loop computes only the taken side), and the rest; all three only where the guards that
        do not vary along the loop hold, else the loop as it was."""
        positive = sh.static(self.k.outer[-1])
        if positive is None:  # (the bounds' index checks run only where the row has elements)
            self.emit(f"if ({extent} > 0) {{")
            self.depth += 1
        self._statements(window.hoisted)
        inside = [v for v in values if v not in window.hoisted]
        inside = self._hoist(inside, row_invariants(inside, var), var)
        lows, highs = [], []
        for lower, n, a, b, shift in window.bounds:
            x = sympy.Symbol(self.body.name(n), integer=True) + shift - b
            if lower:  # var >= ceil(x / a)
                lows.append(index_expr(x) if a == 1 else f"-ember_ifloordiv({index_expr(-x)}, {a})")
            else:  # var <= floor(x / a)
                highs.append(index_expr(x + 1) if a == 1 else f"ember_ifloordiv({index_expr(x)}, {a}) + 1")

        def fold(fn: str, terms: list[str]) -> str:
            out = terms[0]
            for t in terms[1:]:
                out = f"{fn}({out}, {t})"
            return out

        name = var.name
        self.emit(f"// {', '.join(self.body.name(v) for v in window.atoms)}: all true for {name} in "
                  f"[{name}_lo, {name}_hi){' where the uniform ones hold' if window.uniform else ''}")
        low = fold("ember_imax", lows or ["0"])
        self.emit(f"const int64_t {name}_lo = ember_imin(ember_imax({low}, 0), {extent});")
        self.emit(f"const int64_t {name}_hi = ember_imax(ember_imin({fold('ember_imin', highs or [extent])}, "
                  f"{extent}), {name}_lo);")
        if window.uniform:
            self.emit(f"if ({' && '.join(self.body.name(v) for v in window.uniform)}) {{")
            self.depth += 1
        true = window.true_values(values)
        for start, stop, middle in (("0", f"{name}_lo", False), (f"{name}_lo", f"{name}_hi", True),
                                    (f"{name}_hi", extent, False)):
            for v in true:
                if middle:
                    self.body.constants[id(v)] = "true"
                else:
                    self.body.constants.pop(id(v), None)
            self.body.index_rewrite = window.drop_clamps if middle else None
            self._pointwise_loop(var, start, stop, inside, "")
        for v in true:
            self.body.constants.pop(id(v), None)
        self.body.index_rewrite = None
        if window.uniform:
            self.depth -= 1
            self.emit("} else {")
            self.depth += 1
            self._pointwise_loop(var, "0", extent, inside, "")
            self.depth -= 1
            self.emit("}")
        if positive is None:
            self._close_loops(1)

    def _hoist(self, values: list[Value], hoisted: list[Value], var: sympy.Symbol) -> list[Value]:
        """Emit ``hoisted`` (cpp_split.row_invariants) before the loop over ``var``; the rest."""
        if not any(v.kind != "const" for v in hoisted):
            return values
        self.emit(f"// the same along {var.name}: computed once, before its loop")
        self._statements(hoisted)
        done = {id(v) for v in hoisted}
        return [v for v in values if id(v) not in done]

    def _pointwise_loop(self, var, start: str, stop: str, values: list[Value], pragma: str) -> None:
        """The simd loop over ``var`` from ``start`` to ``stop`` computing ``values`` (float16 rows
        converted a strip at a time where it reads or writes them: cpp_staging.py); ``pragma``:
        its parallel for, where it is the outermost loop."""
        staged = staged_accesses(self, values, var)
        trig, checked = ([], []) if staged or self.scalar else _near_trig(values)
        if trig:
            self._near_trig_loops(var, start, stop, values, pragma, trig, checked)
            return
        if not staged:
            self._simd_loop(var, start, stop, values, pragma or "#pragma omp simd")
            return
        open_strip(self, var, start, stop, staged, pragma, "#pragma omp simd")
        self.body.bit_selects = uniform_selects(values, var)
        self._statements(values)
        self.body.bit_selects = set()
        close_strip(self, var, staged)

    def _near_trig_loops(self, var, start: str, stop: str, values: list[Value], pragma: str,
                         trig: list[Value], checked: list[Value]) -> None:
        """``_pointwise_loop``'s loop where it computes float sin, cos or tan: a simd loop over the
        arguments first, then the loop with the near functions where every one is below 2^26, else
        with the full ones; by blocks of NEAR_BLOCK under a flat loop's parallel for."""
        name = var.name
        if pragma:
            self.emit(pragma.replace(" simd", ""))
            self.emit(f"for (int64_t {name}_block = {start}; {name}_block < {stop}; {name}_block += {NEAR_BLOCK}) {{")
            self.depth += 1
            self.emit(f"const int64_t {name}_end = std::min<int64_t>({name}_block + {NEAR_BLOCK}, {stop});")
            start, stop = f"{name}_block", f"{name}_end"
        else:  # (a block of its own: a loop split in two has two checks)
            self.emit("{")
            self.depth += 1
        far = f"{name}_far"
        self.emit(f"int32_t {far} = 0;  // an argument of sin, cos or tan here 2^26 or more (or not finite)")
        self.emit(f"#pragma omp simd reduction(|:{far})")
        self.emit(f"for (int64_t {name} = {start}; {name} < {stop}; ++{name}) {{")
        self.depth += 1
        self._statements(checked)
        for arg in dict.fromkeys(self.body.name(v.srcs[0]) for v in trig):
            self.emit(f"{far} |= (int32_t)!(std::fabs({arg}) < 0x1p26f);")
        self._close_loops(1)
        self.emit(f"if ({far}) {{")
        for near in (False, True):
            self.depth += 1
            for v in trig if near else ():
                self.body.spelled[id(v)] = NEAR_TRIG[v.arg].format(self.body.name(v.srcs[0]))
            self._simd_loop(var, start, stop, values, "#pragma omp simd")
            for v in trig:
                self.body.spelled.pop(id(v), None)
            self.depth -= 1
            self.emit("} else {" if not near else "}")
        self._close_loops(1)  # (the block, or the loop over blocks)

    def _simd_loop(self, var, start: str, stop: str, values: list[Value], pragma: str) -> None:
        self.emit(pragma)
        self.emit(f"for (int64_t {var.name} = {start}; {var.name} < {stop}; ++{var.name}) {{")
        self.depth += 1
        self.body.bit_selects = uniform_selects(values, var)
        self._statements(values)
        self.body.bit_selects = set()
        self._close_loops(1)


def _near_trig(values: list[Value]) -> tuple[list[Value], list[Value]]:
    """The float sin, cos and tan among a loop's values, and the values their arguments need
    (loads, constants, indices and arithmetic, unguarded: a check may compute them anywhere);
    none where there are none or an argument needs anything else."""
    trig = [v for v in values if v.kind == "alu" and v.arg in NEAR_TRIG and v.dtype.is_float and v.dtype.itemsize <= 4]
    if not trig:
        return [], []
    needed = reachable([v.srcs[0] for v in trig])
    checked = [v for v in values if id(v) in needed]
    if any(v.kind not in ("load", "const", "index", "alu") or v.guard is not None for v in checked):
        return [], []
    return trig, checked
