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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from ..ir import dtypes as dt
from ..schedule.kernel_ir import Value
from .cexpr import index_expr

if TYPE_CHECKING:
    from .cpp import CppKernelRenderer

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
        if v.kind not in ("load", "store") or v.arg.bindings:
            continue
        if r.body.buffer_dtype.get(v.arg.buffer) != dt.float16 or not _unit_stride(v.arg.index, var):
            continue
        if v.kind == "load" and v.guard is not None:
            continue
        if v.kind == "store" and (v.arg.accumulate or v.srcs[0].kind == "chunksum"):
            continue
        out.append(v)
    return out


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
