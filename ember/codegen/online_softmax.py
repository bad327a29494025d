"""Online softmax: a row's max and its sum of exp(x - max) in one pass over x.

A softmax (or log-softmax, logsumexp, cross-entropy) reads its row once for the max and again
for the sum of exp(x - max). Kept as a running max m and a running sum s of exp(x - m), rescaled
by exp(m_old - m_new) whenever the max grows, the two take one pass: for rows too long to keep
on chip, one read of the row from memory instead of two. Both GPU backends find the pairs here
and spell the update in their own language.
"""

from __future__ import annotations

import math

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.kernel_ir import Kernel, Value


def exp_of_difference(s: Value) -> Value | None:
    """The x - m of a sum(exp(x - m)), else None."""
    e = s.srcs[0]
    if e.kind == "alu" and e.arg is Op.CAST and e.srcs[0].dtype.is_float:
        e = e.srcs[0]
    if e.kind == "alu" and e.arg is Op.EXP and e.srcs[0].kind == "alu" and e.srcs[0].arg is Op.SUB:
        return e.srcs[0]
    return None


def inf_guarded(m: Value) -> Value | None:
    """The max behind logsumexp's guard, where(|max| == inf, 0, max); else None."""
    if not (m.kind == "alu" and m.arg is Op.WHERE):
        return None
    cond, zero, mx = m.srcs
    if not (zero.kind == "const" and zero.arg == 0 and cond.kind == "alu" and cond.arg is Op.EQ):
        return None
    a, b = cond.srcs
    if a.kind == "alu" and a.arg is Op.ABS and a.srcs[0] is mx and b.kind == "const" and b.arg == math.inf:
        return mx
    return None


def online_softmax_pairs(kernel: Kernel) -> dict[Value, Value]:
    """sum(exp(x - m)) reductions whose m is an amax of the same x in the loop before (or
    logsumexp's guarded where(|amax| == inf, 0, amax)): the two can accumulate together in one
    pass over x (online softmax)."""
    pairs: dict[Value, Value] = {}
    for s in kernel.reductions:
        if s.arg.op is not Op.SUM or not s.srcs[0].dtype.is_float or exp_of_difference(s) is None:
            continue
        x, m = exp_of_difference(s).srcs
        m = inf_guarded(m) or m
        is_max_of_x = m.kind == "reduce" and m.arg.op is Op.AMAX and m.srcs[0] is x
        if is_max_of_x and m.loop == s.loop - 1 and dt.compute_dtype(x.dtype) == dt.float32:
            pairs[s] = m
    return pairs


def guards_infinities(s: Value) -> bool:
    """Does the online sum ``s`` subtract logsumexp's guarded max, 0 where the max is +-inf (else
    0 only where it is -inf: every term so far is exp(-inf) = 0)?"""
    return inf_guarded(exp_of_difference(s).srcs[1]) is not None


def terms_lost_below_one(kernel: Kernel, loop: int) -> list[Value]:
    """The exp(x - max(x)) values that loop ``loop`` computes only to add up (through float
    conversions, a 16-bit rounding among them) into a float32 sum of the row, the max's term 1
    among them. A term below 2^-126 adds nothing there, so it may flush to 0: both GPU backends
    compute such terms with one ex2.approx.ftz, without the subnormal fix-up. (Where the loop
    also stores the term, its subnormals are kept: it is not listed.)"""
    computed = {id(v) for v in kernel.loop_values(loop)}
    users: dict[int, list[Value]] = {}
    for v in kernel.values:
        for s in v.srcs:
            if id(v) in computed or v.loop == loop and v.kind in ("reduce", "store", "chunksum", "dot", "checkindex"):
                users.setdefault(id(s), []).append(v)
    terms = []
    for s in kernel.reductions:
        if s.loop != loop or s.arg.op is not Op.SUM or dt.compute_dtype(s.dtype) != dt.float32:
            continue
        chain, e = [s], s.srcs[0]
        while e.kind == "alu" and e.arg is Op.CAST and e.dtype.is_float and e.srcs[0].dtype.is_float:
            chain.append(e)
            e = e.srcs[0]
        if not (e.kind == "alu" and e.arg is Op.EXP and e.srcs[0].kind == "alu" and e.srcs[0].arg is Op.SUB):
            continue
        x, m = e.srcs[0].srcs
        m = inf_guarded(m) or m
        if not (m.kind == "reduce" and m.arg.op is Op.AMAX and m.srcs[0] is x and m.loop < loop
                and dt.compute_dtype(x.dtype) == dt.float32):
            continue
        # every use of the term and of its conversions in this loop is the next link of the chain
        links = [e, *reversed(chain[1:])]
        if all(users.get(id(a), []) == [b] for a, b in zip(links, [*links[1:], s])):
            terms.append(e)
    return terms
