"""Reductions across OpenMP threads, combined in thread order: the same result every call.

An OpenMP ``reduction`` clause combines the threads' shares in the order the threads finish.
Float sums are not associative and a float max of 0.0 and -0.0 keeps the first it sees, so a
whole-tensor ``x.sum()`` of float64 on a many-core machine, or ``x.amax()`` over zeros of both
signs, changed from call to call. Here each thread keeps its share in its own accumulators (the
loop's worksharing ``omp for`` is static, so thread t always takes the same iterations), writes
them into an array at its thread number, and one thread combines them in that order:

    {  // the threads' shares, combined in thread order
      int ember_team = 1;
      double acc1_t[256];
      #pragma omp parallel num_threads(...) if(...)
      {
        double acc1 = (double)0;  // this thread's share
        #pragma omp for schedule(static) nowait
        for (...) { ... acc1 += ...; }
        acc1_t[omp_get_thread_num()] = acc1;
      }
      for (int ember_t = 0; ember_t < ember_team; ++ember_t) acc1 += acc1_t[ember_t];
    }

Integer, boolean and arg reductions combine exactly in any order: they keep OpenMP's clause.
"""

from __future__ import annotations

from typing import Any

from ..ir.ops import Op
from ..schedule.kernel_ir import Value
from .c_accumulators import acc_type, acc_update

MAX_TEAM = 256  # threads whose shares a reduction keeps (a machine with more uses this many)
_FLOAT_COMBINES = (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN)


def needs_team(reductions: list[Value]) -> bool:
    """Does combining ``reductions`` across threads depend on the order (a float combine)?"""
    return any(v.arg.op in _FLOAT_COMBINES and v.srcs[0].dtype.is_float for v in reductions)


def _shares(r: Any, reductions: list[Value], flagged: list[Value]) -> list[tuple[str, str]]:
    """(C type, accumulator) of each share a thread keeps: the reductions' and their NaN flags."""
    names = r.body.acc_names
    out = [(acc_type(r.body.lang, v), names[id(v)]) for v in reductions]
    out += [(r.flag_type(v), f"{names[id(v)]}_nan") for v in flagged]
    return out


def open_team(r: Any, reductions: list[Value], flagged: list[Value], parallel_if: str, share: list[str]) -> None:
    """Opens the team's region: the shares' arrays, each thread's own accumulators (shadowing the
    kernel's, which receive the combined result) and search hints, then ``share``: a worksharing
    ``omp for`` with no reduction clause for the loop the caller opens next, or the lines that
    compute this thread's range of it."""
    r.emit("{  // the threads' shares, combined in thread order after the loop: the same result every call")
    r.depth += 1
    r.emit("int ember_team = 1;")
    for ctype, acc in _shares(r, reductions, flagged):
        r.emit(f"{ctype} {acc}_t[{MAX_TEAM}];")
    own = f" firstprivate({', '.join(r.hints)})" if r.hints else ""  # (a search's hint: each thread's)
    r.emit(f"#pragma omp parallel num_threads(std::min({MAX_TEAM}, omp_get_max_threads())){own} if({parallel_if})")
    r.emit("{")
    r.depth += 1
    r.emit("// this thread's share")
    for v in reductions:
        r.emit(r.body.reduce_decl(v))
    for v in flagged:
        r.emit(f"{r.flag_type(v)} {r.body.acc_names[id(v)]}_nan = 0;")
    r.emit("#pragma omp single nowait")
    r.emit("ember_team = omp_get_num_threads();")
    for line in share:
        r.emit(line)


def close_team(r: Any, reductions: list[Value], flagged: list[Value]) -> None:
    """Closes the region ``open_team`` opened (its loops closed): each thread's share into its slot,
    then the shares combined in thread order into the kernel's accumulators."""
    shares = _shares(r, reductions, flagged)
    for _, acc in shares:
        r.emit(f"{acc}_t[omp_get_thread_num()] = {acc};")
    r.depth -= 1
    r.emit("}")
    r.emit("for (int ember_t = 0; ember_t < ember_team; ++ember_t) {")
    r.depth += 1
    names = r.body.acc_names
    for v in reductions:
        acc, share = names[id(v)], f"{names[id(v)]}_t[ember_t]"
        if v in flagged:  # (a later thread's equal value does not replace an earlier one's)
            more = ">" if v.arg.op is Op.AMAX else "<"
            r.emit(f"{acc} = {share} {more} {acc} ? {share} : {acc};")
            r.emit(f"{acc}_nan |= {acc}_nan_t[ember_t];")
        elif v.arg.op in (Op.ARGMAX, Op.ARGMIN):
            r.emit(acc_update(v, acc, f"{share}.v", f"{share}.i"))
        else:
            r.emit(acc_update(v, acc, share, ""))
    r.depth -= 1
    r.emit("}")
    r.depth -= 1
    r.emit("}")
