"""Sums of one-hot rows, without the row: a sum along dim d of a value that varies along d only
through ``iota == k`` (k the same along d) has one term where the position is k and N - 1 terms
where it is not, so

    sum_r F(r == k) = where(0 <= k < N, F(true) + (N - 1) * F(false), N * F(false))

computed once per row instead of once per element. Cross-entropy's backward is the case that
matters: log_softmax's backward sums its incoming gradient over the row, and nll_loss's gradient
is ``where(iota == target, -scale, 0)``, so the sum is -scale for a row whose target is valid. The
kernel then makes one pass over the logits (read, write the gradient) instead of a loop over the
row's 32000 positions first.

Exact where eager is: F(false) is usually 0, and t + (N - 1) * 0 is t (NaN and inf in F(false)
propagate as they would through eager's N-term sum; 0.0 is added to the (N - 1) and N copies, as
eager's sum starts from it, so terms all -0.0 sum to 0.0); a nonzero finite F(false) rounds once in the
product where eager adds N - 1 times, as any reordered float sum does. Only float sums over one
dimension, of pointwise ops over the comparison and values that do not vary along d.
"""

from __future__ import annotations

import sympy

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, rewrite
from ..ir.ops import POINTWISE_OPS, Op
from .fold import fold_constants

# (kind, ...) per node: ("row", kept) -- the same along d, as a node of size 1 at d;
# ("split", when_true, when_false, k) -- varies along d only through iota == k
_Analysis = tuple


def one_hot_sums(graph: Graph) -> Graph:
    rewritten = []

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op is not Op.SUM or len(node.arg) != 1 or not node.dtype.is_float:
            return None
        (x,) = inputs
        d = node.arg[0]
        found = _Analyzer(d, x.shape[d]).analyze(x)
        if found is None or found[0] != "split":
            return None
        _, when_true, when_false, k = found
        rewritten.append(node)
        return _closed_form(node, when_true, when_false, k, x.shape[d])

    result = rewrite(graph, rule)
    # F(true) and F(false) select with constant conditions: fold them (only where a sum changed)
    return fold_constants(result) if rewritten else graph


def _closed_form(node: Node, when_true: Node, when_false: Node, k: Node, n: sympy.Expr) -> Node:
    shape, device, origin = node.shape, node.device, node.origin

    def const(value: sympy.Expr | int, dtype: dt.DType) -> Node:
        value = sympy.sympify(value)
        if value.is_number:  # a literal of the constant's type; a symbolic size stays an expression
            value = float(value) if dtype.is_float else int(value)
        c = make(Op.CONST, (), value, dtype=dtype, device=device, origin=origin)
        return make(Op.EXPAND, (c,), shape, device=device) if shape else c

    def times(count: sympy.Expr, value: Node) -> Node:
        # count copies of value summed from 0.0, as eager's sum starts: none sum to 0, where
        # 0 * inf or 0 * NaN would not, and copies of -0.0 to 0.0 (so t + them is t + 0.0: 0.0
        # for a t of -0.0 too). A literal 0 folds to 0.0, leaving t + 0.0
        count = sympy.sympify(count)
        zero = const(0.0, node.dtype)
        product = make(Op.MUL, (const(count, node.dtype), value), origin=origin)
        if count.is_number:
            return make(Op.ADD, (product, zero), origin=origin) if count > 0 else zero
        some = make(Op.GT, (const(count, dt.int64), const(0, dt.int64)), origin=origin)
        return make(Op.ADD, (make(Op.WHERE, (some, product, zero), origin=origin), zero), origin=origin)

    # (compared in int64: n need not fit k's dtype, 256 of a uint8 iota)
    k = make(Op.CAST, (k,), dtype=dt.int64, origin=origin) if k.dtype != dt.int64 else k
    valid = make(Op.AND, (make(Op.GE, (k, const(0, dt.int64)), origin=origin),
                          make(Op.LT, (k, const(n, dt.int64)), origin=origin)), origin=origin)
    hit = make(Op.ADD, (when_true, times(n - 1, when_false)), origin=origin)
    return make(Op.WHERE, (valid, hit, times(n, when_false)), origin=origin)


class _Analyzer:
    """How a value of full size along ``d`` depends on its position there."""

    def __init__(self, d: int, n: sympy.Expr):
        self.d, self.n = d, n
        self.memo: dict[Node, _Analysis | None] = {}
        self.k: Node | None = None  # the one position compared with; a second one gives up

    def analyze(self, node: Node) -> _Analysis | None:
        if node not in self.memo:
            if self._reads_inputs(node):
                self._inputs_first(node)
            self.memo[node] = self._analyze(node)
        return self.memo[node]

    def _reads_inputs(self, node: Node) -> bool:
        """Does _analyze(node) analyze each of its inputs, and nothing else?"""
        return (node.op in POINTWISE_OPS and node.op not in (Op.EQ, Op.NE) and node.shape is not None
                and node.rank > self.d and sh.equal(node.shape[self.d], self.n))

    def _inputs_first(self, node: Node) -> None:
        """Analyze what ``node`` reads in the order the recursion would, deepest first, with a
        stack: a chain of hundreds of pointwise ops before a sum went past Python's recursion
        limit."""
        stack = [(node, iter(node.inputs))]
        while stack:
            top, inputs = stack[-1]
            for i in inputs:
                if i in self.memo:
                    continue
                if self._reads_inputs(i):
                    stack.append((i, iter(i.inputs)))
                    break
                self.analyze(i)
            else:
                stack.pop()
                if stack:  # (``node`` itself is the caller's)
                    self.analyze(top)

    def _kept_shape(self, node: Node) -> sh.Shape:
        return node.shape[:self.d] + (sympy.Integer(1),) + node.shape[self.d + 1:]

    def _analyze(self, node: Node) -> _Analysis | None:
        d = self.d
        if node.shape is None or node.rank <= d or not sh.equal(node.shape[d], self.n):
            return None
        if node.op is Op.EXPAND:
            (x,) = node.inputs
            if x.rank == 0 or sh.is_one(x.shape[d]):  # broadcast along d: the same everywhere on it
                return "row", make(Op.EXPAND, (x,), self._kept_shape(node), origin=node.origin)
            return None
        if node.op in (Op.EQ, Op.NE):
            k = self._position_compared(node)
            if k is not None:
                if self.k is not None and self.k is not k:
                    return None
                self.k = k
                hit, miss = node.op is Op.EQ, node.op is Op.NE
                return ("split", self._bool(hit, node), self._bool(miss, node), k)
        if node.op not in POINTWISE_OPS:
            return None
        parts = [self.analyze(i) for i in node.inputs]
        if any(p is None for p in parts):
            return None
        if all(p[0] == "row" for p in parts):
            return "row", make(node.op, [p[1] for p in parts], node.arg, dtype=node.dtype, origin=node.origin)
        when_true = make(node.op, [p[1] for p in parts], node.arg, dtype=node.dtype, origin=node.origin)
        when_false = make(node.op, [p[2] if p[0] == "split" else p[1] for p in parts], node.arg,
                          dtype=node.dtype, origin=node.origin)
        return "split", when_true, when_false, self.k

    def _bool(self, value: bool, like: Node) -> Node:
        c = make(Op.CONST, (), value, dtype=dt.bool_, device=like.device, origin=like.origin)
        return make(Op.EXPAND, (c,), self._kept_shape(like))

    def _position_compared(self, node: Node) -> Node | None:
        """k (kept along d) in ``iota_d == k`` or ``k == iota_d``: iota_d the positions 0..N-1
        along d, k an integer the same along d."""
        for a, b in (node.inputs, node.inputs[::-1]):
            if self._is_positions(a) and b.dtype.is_int:
                found = self.analyze(b)
                if found is not None and found[0] == "row":
                    return found[1]
        return None

    def _is_positions(self, node: Node) -> bool:
        """expand(reshape(iota(N, start 0, step 1)), ...) with the iota along d."""
        if node.op is not Op.EXPAND or not node.dtype.is_int:
            return False
        (x,) = node.inputs
        if x.op is not Op.RESHAPE or x.rank != node.rank:
            return False
        iota = x.inputs[0]
        if iota.op is not Op.IOTA or tuple(iota.arg[1:]) != (0, 1) or not sh.equal(iota.arg[0], self.n):
            return False
        return all(sh.is_one(s) for i, s in enumerate(x.shape) if i != self.d) and sh.equal(x.shape[self.d], self.n)
