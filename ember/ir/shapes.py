"""Symbolic sizes: shapes are tuples of sympy expressions over the size symbols of Dynamo's shape
environment (``s0``, ``s1``, ...). Static sizes are plain ``sympy.Integer``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import reduce

import sympy
from torch.utils._sympy.functions import CleanDiv as _CleanDiv
from torch.utils._sympy.functions import FloorDiv as _FloorDiv
from torch.utils._sympy.functions import IntTrueDiv as _IntTrueDiv
from torch.utils._sympy.functions import Max as _TorchMax
from torch.utils._sympy.functions import Min as _TorchMin
from torch.utils._sympy.functions import Mod as _TorchMod
from torch.utils._sympy.functions import ModularIndexing as _ModularIndexing
from torch.utils._sympy.functions import PythonMod as _PythonMod

Expr = sympy.Expr
Shape = tuple[sympy.Expr, ...]
# sympy's max and min, and torch's (Dynamo's shapes use its own: Max(3, s21, s81))
MAXES = (sympy.Max, _TorchMax)
MINS = (sympy.Min, _TorchMin)


def nonnegative(e: object) -> bool:
    """Whether an integer size or index expression is never negative, as far as its symbols'
    assumptions show (loop indices and sizes are not negative; an int argument may be): where it
    is, C's truncating / and % agree with Python's flooring // and %."""
    e = sympy.sympify(e)
    if e.is_nonnegative:
        return True
    if isinstance(e, (_FloorDiv, _CleanDiv, _ModularIndexing, sympy.Add, sympy.Mul, *MINS)):
        return all(nonnegative(a) for a in e.args)
    if isinstance(e, (_TorchMod, _PythonMod, sympy.Mod)):  # (a floored remainder has the divisor's sign)
        return nonnegative(e.args[1])
    if isinstance(e, MAXES):
        return any(nonnegative(a) for a in e.args)
    return False


# integer bitwise functions of sizes (``n & 3``), torch's BitwiseFn_<name>: C, Python and Triton
# spell them alike, and on int64 two's complement they agree with Python's ints
_BITWISE = {"BitwiseFn_bitwise_and": "&", "BitwiseFn_bitwise_or": "|", "BitwiseFn_bitwise_xor": "^"}


def bitwise_operator(e: object) -> str | None:
    """The C/Python operator of one of torch's bitwise size functions, or None."""
    return _BITWISE.get(type(e).__name__)


def abs_as_max(e: sympy.Expr) -> sympy.Expr:
    """|a| as max(a, -a), which every printer spells (``abs(n - 5)`` of a size)."""
    (a,) = e.args
    return sympy.Max(a, -a, evaluate=False)


def size_quotient(e: object) -> bool:
    """A size divided by a positive integer as floats (h / 32, Dynamo's IntTrueDiv): its floor
    and ceiling are integer divisions, exact in every spelling (sizes are not negative)."""
    return isinstance(e, _IntTrueDiv) and e.args[1].is_Integer and int(e.args[1]) > 0


# float functions of sizes (``math.sqrt(x.shape[-1])``, an attention scale) that C, Python's
# math and Triton all spell by this name; torch's sympy calls them OpaqueUnaryFn_<name>
UNARY_FLOAT_FNS = frozenset({"sqrt", "exp", "log", "sin", "cos"})


def unary_float_fn(e: object) -> str | None:
    """The function name of one of torch's ``OpaqueUnaryFn_*`` size expressions, or None."""
    name = type(e).__name__
    if not name.startswith("OpaqueUnaryFn_"):
        return None
    fn = name[len("OpaqueUnaryFn_"):]
    return fn if fn in UNARY_FLOAT_FNS else None


def expr(value: object) -> sympy.Expr:
    """An int, a sympy expression, or a torch SymInt (via its ``node.expr``) as a sympy expr."""
    if isinstance(value, sympy.Basic):
        return value
    if isinstance(value, bool):
        return sympy.Integer(int(value))
    if isinstance(value, int):
        return sympy.Integer(value)
    node = getattr(value, "node", None)  # torch.SymInt without importing torch here
    if node is not None and hasattr(node, "expr"):
        return node.expr
    raise TypeError(f"not a size: {value!r}")


def shape(values: Iterable[object]) -> Shape:
    return tuple(expr(v) for v in values)


def numel(s: Sequence[sympy.Expr]) -> sympy.Expr:
    return reduce(lambda a, b: a * b, s, sympy.Integer(1))


def equal(a: object, b: object) -> bool:
    a, b = expr(a), expr(b)
    if a == b:
        return True
    if a.is_Integer and b.is_Integer:  # (most sizes: no expansion needed to tell them apart)
        return False
    return sympy.expand(a - b) == 0


def provably_different(a: object, b: object) -> bool:
    """True only when ``a != b`` for every value of the size symbols we can tell about; sizes
    from Dynamo are already validated by ATen, so "cannot tell" is not a mismatch."""
    diff = sympy.expand(expr(a) - expr(b))
    return diff.is_number and diff != 0


def shapes_equal(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))


def is_one(e: object) -> bool:
    return equal(e, 1)


def static(e: object) -> int | None:
    """The int value of a size when it is known at compile time, else None."""
    e = expr(e)
    return int(e) if e.is_Integer else None


def contiguous_strides(s: Sequence[sympy.Expr]) -> Shape:
    strides: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for size in reversed(s):
        strides.append(acc)
        acc = acc * size
    return tuple(reversed(strides))


def broadcast(*shapes: Sequence[sympy.Expr]) -> Shape:
    """numpy/torch broadcasting of symbolic shapes; raises ValueError when sizes conflict."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[sympy.Expr] = []
    for i in range(rank):
        size: sympy.Expr = sympy.Integer(1)
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if is_one(d):
                continue
            if is_one(size):
                size = d
            elif not equal(size, d):
                raise ValueError(f"shapes {[tuple(x) for x in shapes]} do not broadcast")
        out.append(size)
    return tuple(out)


def is_float_symbol(s: sympy.Symbol) -> bool:
    """A float the program reads from the data (``x.item()`` of a float tensor), not a size:
    kernels take it as a double."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    return symbol_is_type(s, (SymT.FLOAT, SymT.UNBACKED_FLOAT))


def is_data_dependent(s: sympy.Symbol) -> bool:
    """A size or value only the data decides (nonzero's count, ``x.item()``): no input carries
    it, an ATen call's result binds it when the program runs."""
    from torch.utils._sympy.symbol import SymT, symbol_is_type
    return symbol_is_type(s, (SymT.UNBACKED_INT, SymT.UNBACKED_FLOAT))


def size_ctype(s: sympy.Symbol) -> str:
    """The C type of a kernel's size argument."""
    return "double" if is_float_symbol(s) else "int64_t"


def free_symbols(items: Iterable[object]) -> set[sympy.Symbol]:
    syms: set[sympy.Symbol] = set()
    for item in items:
        if isinstance(item, sympy.Basic):
            syms |= item.free_symbols
    return syms


def fmt(s: Sequence[sympy.Expr]) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"
