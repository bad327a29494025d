"""Triton: scan kernels (``Kernel.scans``: cumsum, cumprod, logcumsumexp and what they fuse).

Each program takes XBLOCK rows and walks them in RBLOCK-wide chunks, in order (from the row's end
when the kernel's scans are reversed): a chunk's scan is ``tl.associative_scan`` along the
chunk, combined with the running value the earlier chunks left (a [XBLOCK, 1] carry per scan),
which then takes in the chunk's total. Lanes past the row's end scan the combine's neutral, so
the carry is the row's. Where RBLOCK covers the row (the launcher's PERSISTENT configurations)
the loop runs once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..schedule.kernel_ir import Value
from .c_accumulators import int_bound
from .triton_alu import compute_type

if TYPE_CHECKING:
    from .triton import TritonKernelRenderer

_NEUTRAL = {"sum": "0", "prod": "1", "logsumexp": "float('-inf')"}
_COMBINE = {"sum": "eh.add", "prod": "eh.mul", "logsumexp": "eh.logaddexp", "max": "eh.scan_max",
            "min": "eh.scan_min"}


def _neutral(v: Value) -> str:
    combine = v.arg.combine
    if combine not in ("max", "min"):
        return _NEUTRAL[combine]
    if v.dtype.is_float:
        return f"float('{'-' if combine == 'max' else ''}inf')"
    return str(int_bound(v.dtype, combine == "min"))


def render_scan(r: TritonKernelRenderer) -> None:
    """The body of a scan kernel (one loop; every store along the rows)."""
    k = r.k
    r._x_setup("[:, None]")
    r.statements([v for v in k.values if not v.inner and v.kind != "store"])
    for v in k.scans:
        r.emit(f"carry{r.name(v)} = tl.full([XBLOCK, 1], {_neutral(v)}, {compute_type(v.dtype)})")
    order = "from the row's end" if k.scan_reverse else "in order"
    r.emit(f"for roffset in range(0, INNER, RBLOCK):  # the rows' chunks, {order}")
    r.depth += 1
    r._r_setup("roffset")
    if k.scan_reverse:  # chunk positions count from the row's end: r0 runs down
        r.emit(f"r0 = {_last(r)} - r0")
    r.statements(k.loop_values(1))
    r.statements([v for v in k.values if v.kind == "store" and v.inner])
    r.depth -= 1


def _last(r: TritonKernelRenderer) -> str:
    from .triton import static_bound
    bound = static_bound(r.k.inner, "INNER")
    return str(int(bound) - 1) if bound.isdigit() else f"({bound} - 1)"


def scan_statement(r: TritonKernelRenderer, v: Value) -> str:
    """A scan value: this chunk's scan of its source (neutral past the row), after the carry;
    the carry then takes in the chunk's total."""
    name, combine, acc = r.name(v), _COMBINE[v.arg.combine], compute_type(v.dtype)
    neutral = _neutral(v)
    pad = "    " * r.depth
    src = f"tl.where(xmask & rmask, {r.name(v.srcs[0])}.to({acc}), {neutral})"
    scanned = (f"{name}_in = {src}\n"
               f"{pad}{name} = {combine}(carry{name}, tl.associative_scan({name}_in, 1, {combine}))\n")
    if v.arg.combine in ("max", "min"):
        # the chunk's last lane (lanes past the row hold the neutral: the row's scan so far); a
        # reduce of the chunk would combine in any order, and these keep the later of a tie
        last = f"tl.where(tl.arange(0, RBLOCK)[None, :] == RBLOCK - 1, {name}, {neutral})"
        return scanned + f"{pad}carry{name} = tl.reduce({last}, 1, {combine})[:, None]"
    return scanned + f"{pad}carry{name} = {combine}(carry{name}, tl.reduce({name}_in, 1, {combine})[:, None])"
