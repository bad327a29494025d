"""Online softmax in the CUDA C++ backend's row kernels (online_softmax.py): a row's running max
and sum of exp(x - max) in one loop, where rows are too long to keep in registers (a 32000- or
50257-class cross-entropy), so the row is read from memory once for both instead of twice.
Where the row is kept, the second loop reads registers and the plain two loops issue fewer
instructions (the row kernels are bound by instruction issue there), so they stay.

Each thread keeps (m, s): s = sum of exp(x - m') over its elements, m' its max m as the graph
subtracts it (``max_in_use``). A group of consecutive elements (the vector form) takes its own
max first and rescales s once, so a group of 8 costs 9 exps rather than 16; a lone element (the
scalar loop, a peeled row's head and tail) rescales on its own. The terms exp(x - m) are one
ex2.approx.ftz each (``ember_exp_ftz``: a term below 2^-126 is lost next to the max's own 1);
the rescalings keep the subnormal fix-up. Across the block, each thread's
s is rescaled to the block's max, then summed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value
from .cuda_prelude import REDUCTION_THREADS, UNROLL
from .online_softmax import guards_infinities, online_softmax_pairs

if TYPE_CHECKING:
    from .cuda import CudaKernelRenderer


def row_pairs(kernel: Kernel, kind: str, width: int, keeps_rows: bool, row_groups: bool) -> dict[Value, Value]:
    """The online pairs (sum -> its max) a row kernel accumulates together: rows statically
    longer than the largest block's one iteration covers, read from memory in every loop."""
    inner = sh.numel(kernel.inner)
    if kind != "rows" or kernel.chunks or keeps_rows or row_groups or not inner.is_number:
        return {}
    if int(inner) <= REDUCTION_THREADS * UNROLL * max(1, width):
        return {}
    return online_softmax_pairs(kernel)


def max_in_use(s: Value, m: str) -> str:
    """The max the sum ``s`` subtracts, given the max ``m``: 0 where m is -inf (every term is
    then exp(-inf) = 0) and, behind logsumexp's guard, where it is +inf too; else m."""
    if guards_infinities(s):
        return f"(fabsf({m}) == INFINITY ? 0.0f : {m})"
    return f"({m} == -INFINITY ? 0.0f : {m})"


def element_update(r: CudaKernelRenderer, m: Value, sums: list[Value]) -> None:
    """One element x into the thread's running max and its sums (several where a softmax and a
    log-softmax of one x share its max)."""
    am, x = r.body.acc_names[id(m)], r.body.name(m.srcs[0])
    r.open("{  // online softmax: the running max, and the sums rescaled to it")
    r.emit(f"const float ember_mn = ember_max({am}, {x});")
    for s in sums:
        acc = r.body.acc_names[id(s)]
        r.emit(f"{acc} = {acc} * ember_exp_approx({am} - {max_in_use(s, 'ember_mn')}) + "
               f"ember_exp_ftz({x} - {max_in_use(s, 'ember_mn')});")
    r.emit(f"{am} = ember_mn;")
    r.close()


def group_slot(m: Value, r: CudaKernelRenderer) -> str:
    return f"ember_xs{r.body.acc_names[id(m)][3:]}"


def group_element(r: CudaKernelRenderer, m: Value) -> None:
    """In a group's element loop: x into the group's slots."""
    r.emit(f"{group_slot(m, r)}[ember_k] = {r.body.name(m.srcs[0])};")


def group_update(r: CudaKernelRenderer, m: Value, sums: list[Value], width: int) -> None:
    """After a group's element loop: its max, then its terms against the new running max."""
    am, xs = r.body.acc_names[id(m)], group_slot(m, r)
    r.open("{  // online softmax: the group's max, the running max, the sums rescaled to it once")
    r.emit(f"float ember_gm = {xs}[0];")
    r.emit("#pragma unroll")
    r.emit(f"for (int ember_k = 1; ember_k < {width}; ++ember_k) ember_gm = ember_max(ember_gm, {xs}[ember_k]);")
    r.emit(f"const float ember_mn = ember_max({am}, ember_gm);")
    for i, s in enumerate(sums):
        acc = r.body.acc_names[id(s)]
        r.emit(f"const float ember_mu{i} = {max_in_use(s, 'ember_mn')};")
        r.emit(f"float ember_gs{i} = 0.0f;")
        r.emit("#pragma unroll")
        r.emit(f"for (int ember_k = 0; ember_k < {width}; ++ember_k) "
               f"ember_gs{i} += ember_exp_ftz({xs}[ember_k] - ember_mu{i});")
        r.emit(f"{acc} = {acc} * ember_exp_approx({am} - ember_mu{i}) + ember_gs{i};")
    r.emit(f"{am} = ember_mn;")
    r.close()


def combine_threads(r: CudaKernelRenderer, m: Value, sums: list[Value], line: Callable[[Value], str]) -> None:
    """The block's max of the threads' maxima, then their sums rescaled to it and added
    (``line``: the renderer's reduction across the block of a value's accumulator)."""
    am = r.body.acc_names[id(m)]
    r.emit(f"const float ember_mt{am[3:]} = {am};  // this thread's max, which its sums are against")
    r.emit(line(m))
    r.emit(r.body.reduce_result(m))
    for s in sums:
        acc = r.body.acc_names[id(s)]
        r.emit(f"{acc} *= ember_exp_approx(ember_mt{am[3:]} - {max_in_use(s, r.body.name(m))});")
        r.emit(line(s))
        r.emit(r.body.reduce_result(s))
