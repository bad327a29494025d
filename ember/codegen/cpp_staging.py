"""CPU loops over float16 rows, converted STAGE elements at a time (F16C: 8 an instruction).

GCC 12 converts a ``_Float16`` one element at a time, so the prelude's per-element conversions
are integer and float steps the vectorizer can take (about 10 instructions an element for a
load and a store). A CPU with F16C converts 8 elements in one instruction, but only through
intrinsics, which a loop body of scalar statements cannot use. So a SIMD loop that reads or
writes float16 rows at consecutive elements is strip-mined:

    for i_stage in [start, stop) by STAGE:
        x_row[] = float(x[i_stage ...])          # ember_f16_row_to_f32, 8 at a time
        for i_off in [0, n) (simd):
            i = i_stage + i_off
            <the body, reading x_row[i_off], writing y_row[i_off]>
        y[i_stage ...] = half(y_row[])            # ember_f32_row_to_f16, rounded to nearest even

The rows stay in L1 (STAGE floats each). Both conversions are exact (the store rounds the float
to the nearest half, as ember_f32_to_f16 does), so results are the same bits as before; on a CPU
without F16C the row helpers convert element by element with the prelude's steps.

A row kernel (a thread per row, one inner loop variable) converts some loads whole, once
(``converted_once``), where strips would convert the same elements again and again:

    w_all[] = float(w[0 .. n))                   # before the rows: a norm's weight, every row alike
    for o (parallel):
        x_all[] = float(x[o, 0 .. n))            # the row that two or more of its loops read
        loop 1 over i: ... x_all[i] ...           # (strips only for what is left: the stores)
        loop 2 over i: ... x_all[i] ... w_all[i] ...

A float16 layer norm converted its row three times and its weight and bias once a row, and took
1.4x eager's time on this machine's CPU; about eager's after (bench/RESULTS.md, hundred-and-sixth
session; bench/half_rows.py compares the two).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import dtypes as dt
from ..schedule.kernel_ir import Value, inner_var, outer_var
from .cexpr import index_expr

if TYPE_CHECKING:
    from ..schedule.kernel_ir import Kernel
    from .cpp import CppKernelRenderer

# ember_scratch_row slots of the rows converted once: a thread's own rows from ROW_SLOT on (slot 0
# is the row a kernel keeps for a later loop, SCRATCH_ROW), the rows every row reads, which the
# calling thread converts before the parallel loop and is itself a worker of, from SHARED_SLOT on
ROW_SLOT, SHARED_SLOT = 1, 16

# float16 elements a strip-mined loop converts at a time. Timed on AVX2 (bench/RESULTS.md): 64 and
# 128 alike on relu(x) + 2y + 1 (4096 x 4096), 128 faster on row kernels (layer_norm 8-15%,
# softmax 6%: their reductions combine lanes once a strip), 256 slower on all three (10-30%).
STAGE = 128

PRELUDE = r"""
// float16 rows to float and back (codegen/cpp_staging.py): F16C's 8-wide conversions where the
// CPU has them (GCC does not vectorize a _Float16 conversion), the steps above for the rest
#if defined(__F16C__)
#include <immintrin.h>
#endif
EMBER_FN void ember_f16_row_to_f32(float* out, const _Float16* in, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(in + i))));
#endif
  for (; i < n; ++i) out[i] = ember_f16_to_f32(in[i]);
}
EMBER_FN void ember_f32_row_to_f16(_Float16* out, const float* in, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) out[i] = ember_f32_to_f16(in[i]);
}
"""


def _unit_stride(index: sympy.Expr, var: sympy.Symbol) -> bool:
    """Does ``index`` step by one element with ``var``, its other terms free of it?"""
    return var not in sympy.expand(index - var).free_symbols


def staged_accesses(r: CppKernelRenderer, values: list[Value], var: sympy.Symbol) -> list[Value]:
    """The loads and stores among ``values`` (a loop's body over ``var``) that read or write a
    float16 buffer at consecutive elements, unconditionally: those a strip converts as a row. Not
    gathers or writes at indices, accumulating writes, or a guarded load (its guard may be what
    keeps it in bounds)."""
    if r.scalar:
        return []
    out = []
    for v in values:
        if v.kind not in ("load", "store") or v.arg.bindings or id(v) in r.converted_once:
            continue
        if r.body.buffer_dtype.get(v.arg.buffer) != dt.float16 or not _unit_stride(v.arg.index, var):
            continue
        if v.kind == "load" and v.guard is not None:
            continue
        if v.kind == "store" and (v.arg.accumulate or v.srcs[0].kind == "chunksum"):
            continue
        out.append(v)
    return out


def converted_once(r: CppKernelRenderer, k: Kernel) -> tuple[list[Value], list[Value]]:
    """(shared, own): the float16 loads of a row kernel that are converted whole, once (see the
    module's docstring). ``shared`` read the same elements in every row; ``own`` read this row's,
    in two or more of its loops. Only kernels of one inner variable whose loops run over the whole
    row (not segments, scans or rows spread over threads) qualify."""
    if r.scalar or len(k.inner) != 1 or k.segment_length is not None or k.scans or k.n_loops == 0:
        return [], []
    var = inner_var(0)
    outer = {outer_var(i) for i in range(len(k.outer))}
    written = {v.arg.buffer for v in k.values if v.kind == "store"}  # (read back in a later loop)
    loops_reading: dict[int, int] = {}
    loads: dict[int, Value] = {}
    for loop in range(1, k.n_loops + 1):
        for v in staged_accesses(r, k.loop_values(loop), var):
            if v.kind == "load" and v.arg.buffer not in written:
                loops_reading[id(v)] = loops_reading.get(id(v), 0) + 1
                loads[id(v)] = v
    shared = [v for v in loads.values() if not v.arg.index.free_symbols & outer]
    # A row read by two loops beside a shared row (RMSNorm's x beside its weight) ran as fast as
    # strips or slower at 2048-32768 columns on this machine's CPU; read by three (a layer norm's),
    # or by two with nothing shared (softmax's), it ran 5-30% faster at 1024-32768.
    least = 2 if not shared else 3
    own = [v for v in loads.values() if v.arg.index.free_symbols & outer and loops_reading[id(v)] >= least]
    return shared, own


def convert_once(r: CppKernelRenderer, k: Kernel, loads: list[Value], first_slot: int, what: str) -> None:
    """Converts each of ``loads`` over the whole row into a float row of ember_scratch_row's slot
    ``first_slot`` on, which its loads then read (``r.body.staged``) in every loop."""
    if not loads:
        return
    var = inner_var(0)
    n = index_expr(k.inner[0])
    r.emit(f"// {what}, converted to float once (cpp_staging.py)")
    for slot, v in enumerate(loads, first_slot):
        row = f"{r.body.name(v)}_all"
        start = index_expr(v.arg.index.xreplace({var: sympy.Integer(0)}))
        r.emit(f"float* {r.body.lang.restrict} {row} = ember_scratch_row<float, {slot}>({n});  // {v.arg.buffer}")
        r.emit(f"ember_f16_row_to_f32({row}, &{v.arg.buffer}[{start}], {n});")
        r.body.staged[id(v)] = f"{row}[{var.name}]"
        r.converted_once.add(id(v))


def open_strip(r: CppKernelRenderer, var: sympy.Symbol, start: str, stop: str, staged: list[Value],
               pragma: str, simd: str) -> None:
    """Opens the strip loop over ``var`` from ``start`` to ``stop`` (under ``pragma``, a parallel
    for, where given), converts the strip of each staged
    load into its row, and opens the simd loop (under ``simd``) over the strip, which defines
    ``var``. Staged accesses then read and write their rows (``r.body.staged``)."""
    name = var.name
    if pragma:
        r.emit(pragma)
    r.emit(f"for (int64_t {name}_stage = {start}; {name}_stage < {stop}; {name}_stage += {STAGE}) {{")
    r.depth += 1
    if start == "0" and stop.isdigit() and int(stop) % STAGE == 0:  # whole strips: a constant count
        r.emit(f"const int64_t {name}_n = {STAGE};")
    else:
        r.emit(f"const int64_t {name}_n = std::min<int64_t>({STAGE}, {stop} - {name}_stage);")
    stage_var = sympy.Symbol(f"{name}_stage", integer=True)
    for v in staged:
        row = f"{r.body.name(v)}_row"
        r.body.staged[id(v)] = f"{row}[{name}_off]"
        r.emit(f"alignas(32) float {row}[{STAGE}];  // {'read from' if v.kind == 'load' else 'written to'} "
               f"{v.arg.buffer}")
    for v in staged:
        if v.kind == "load":
            start_ref = f"&{v.arg.buffer}[{index_expr(v.arg.index.xreplace({var: stage_var}))}]"
            r.emit(f"ember_f16_row_to_f32({r.body.name(v)}_row, {start_ref}, {name}_n);")
    if simd:
        r.emit(simd)
    r.emit(f"for (int64_t {name}_off = 0; {name}_off < {name}_n; ++{name}_off) {{")
    r.depth += 1
    r.emit(f"const int64_t {name} = {name}_stage + {name}_off;")


def close_strip(r: CppKernelRenderer, var: sympy.Symbol, staged: list[Value]) -> None:
    """Closes the simd loop ``open_strip`` opened, rounds each staged store's row into its
    buffer, and closes the strip loop."""
    r.depth -= 1
    r.emit("}")
    stage_var = sympy.Symbol(f"{var.name}_stage", integer=True)
    for v in staged:
        if v.kind == "store":
            start_ref = f"&{v.arg.buffer}[{index_expr(v.arg.index.xreplace({var: stage_var}))}]"
            r.emit(f"ember_f32_row_to_f16({start_ref}, {r.body.name(v)}_row, {var.name}_n);")
    r.depth -= 1
    r.emit("}")
