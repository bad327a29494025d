"""The meaning of every IR op, written with torch.

Constant folding evaluates nodes with it, the runtime runs a kernel group through it when the
group's kernel fails to build, and tests compare generated kernels with it. Sizes are symbolic in
the IR, so evaluation takes the values of the size symbols.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir.node import ArgRef, Graph, Node
from ..ir.ops import Op
from ..ragged.ops import identity, segment_reduce

Sizes = Mapping[sympy.Symbol, int]

_UNARY = {
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.EXP2: torch.exp2,
    Op.EXPM1: torch.expm1, Op.LOG: torch.log, Op.LOG2: torch.log2, Op.LOG10: torch.log10,
    Op.LOG1P: torch.log1p, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt,
    Op.RECIPROCAL: torch.reciprocal, Op.SIN: torch.sin, Op.COS: torch.cos, Op.TAN: torch.tan,
    Op.ASIN: torch.asin, Op.ACOS: torch.acos, Op.ATAN: torch.atan, Op.SINH: torch.sinh,
    Op.COSH: torch.cosh, Op.TANH: torch.tanh, Op.ASINH: torch.asinh, Op.ACOSH: torch.acosh,
    Op.ATANH: torch.atanh, Op.SIGMOID: torch.sigmoid, Op.ERF: torch.erf, Op.ERFC: torch.erfc,
    Op.ONE_PLUS_ERF: lambda x: torch.erf(x) + 1,
    Op.FLOOR: torch.floor, Op.CEIL: torch.ceil, Op.ROUND: torch.round, Op.TRUNC: torch.trunc,
    Op.SIGN: torch.sign, Op.NOT: torch.logical_not, Op.BITNOT: torch.bitwise_not,
    Op.ISNAN: torch.isnan, Op.ISINF: torch.isinf, Op.SIGNBIT: torch.signbit,
}
_BINARY = {
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div,
    Op.FLOORDIV: lambda a, b: torch.div(a, b, rounding_mode="floor"),
    Op.TRUNCDIV: lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    Op.MOD: torch.remainder, Op.FMOD: torch.fmod, Op.POW: torch.pow, Op.MAX: torch.maximum,
    Op.MIN: torch.minimum, Op.ATAN2: torch.atan2, Op.EQ: torch.eq, Op.NE: torch.ne,
    Op.LT: torch.lt, Op.LE: torch.le, Op.GT: torch.gt, Op.GE: torch.ge,
    Op.AND: torch.logical_and, Op.OR: torch.logical_or, Op.XOR: torch.logical_xor,
    Op.BITAND: torch.bitwise_and, Op.BITOR: torch.bitwise_or, Op.BITXOR: torch.bitwise_xor,
    Op.SHL: torch.bitwise_left_shift, Op.SHR: torch.bitwise_right_shift, Op.HYPOT: torch.hypot,
    Op.COPYSIGN: torch.copysign, Op.NEXTAFTER: torch.nextafter, Op.GCD: torch.gcd, Op.LCM: torch.lcm,
}


def evaluate(expr: Any, sizes: Sizes) -> Any:
    """A size expression (or plain number) as a Python int/float/bool."""
    if not isinstance(expr, sympy.Basic):
        return expr
    # (a float read with x.item() stays a float: Integer(v) truncated it)
    value = expr.xreplace({s: sympy.Float(v, 17) if isinstance(v, float) else sympy.Integer(v)
                           for s, v in sizes.items()}) if expr.free_symbols else expr
    if value.free_symbols:
        raise KeyError(f"no value bound for {sorted(map(str, value.free_symbols))} in {expr}")
    if value.is_Integer or value.is_integer:
        return int(value)
    if value in (sympy.true, sympy.false):
        return bool(value)
    return float(value)


def fill_template(template: Any, tensors: Sequence[Any], sizes: Sizes) -> Any:
    if isinstance(template, ArgRef):
        return tensors[template.index]
    if isinstance(template, list):
        return [fill_template(t, tensors, sizes) for t in template]
    if isinstance(template, tuple):
        return tuple(fill_template(t, tensors, sizes) for t in template)
    if isinstance(template, dict):
        return {k: fill_template(v, tensors, sizes) for k, v in template.items()}
    if isinstance(template, sympy.Basic):
        return evaluate(template, sizes)
    return template


def eval_node(node: Node, args: Sequence[Any], sizes: Sizes) -> Any:
    """``node`` applied to already-evaluated input values."""
    op = node.op
    device = torch.device(node.device)
    if op is Op.CONST:
        return torch.tensor(evaluate(node.arg, sizes), dtype=dt.to_torch(node.dtype), device=device)
    if op is Op.TENSOR:
        return node.arg.value
    if op is Op.IOTA:
        length, start, step = (evaluate(a, sizes) for a in node.arg)
        return torch.arange(start, start + length * step, step, dtype=dt.to_torch(node.dtype),
                            device=device)[:length]
    if op is Op.CAST:
        return args[0].to(dt.to_torch(node.dtype))
    if op in _UNARY:
        return _UNARY[op](args[0])
    if op in _BINARY:
        return _BINARY[op](args[0], args[1])
    if op is Op.WHERE:
        return torch.where(*args)
    if op is Op.RESHAPE:
        return args[0].reshape([evaluate(s, sizes) for s in node.arg])
    if op is Op.PERMUTE:
        return args[0].permute(node.arg)
    if op is Op.EXPAND:
        return args[0].expand([evaluate(s, sizes) for s in node.arg])
    if op is Op.SLICE:
        dim, start, step, length = (evaluate(a, sizes) for a in node.arg)
        index = [slice(None)] * args[0].dim()
        index[dim] = slice(start, start + (length - 1) * step + 1 if length else start, step)
        return args[0][tuple(index)]
    if op in (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL, Op.ARGMAX, Op.ARGMIN):
        return _reduce(op, args[0], tuple(node.arg))
    if op is Op.CAT:
        return torch.cat(args, node.arg)
    if op is Op.PAD:
        pads = [evaluate(v, sizes) for lo_hi in reversed(node.arg) for v in lo_hi]
        return torch.nn.functional.pad(args[0], pads, value=args[1].item())
    if op is Op.GATHER:
        return torch.gather(args[0], node.arg, args[1])
    if op is Op.INDEX:
        return args[0][(slice(None),) * node.arg + tuple(args[1:])]
    if op is Op.INDEX_PUT:
        start, accumulate, _error = node.arg
        if isinstance(accumulate, str):  # amax/amin: every dim indexed (a scatter_reduce's)
            flat = torch.zeros_like(args[2])
            for i, n in zip(torch.broadcast_tensors(*args[2:]), args[0].shape):
                flat = flat * n + i % n
            out = args[0].flatten().scatter_reduce(0, flat.flatten(), args[1].flatten(), accumulate)
            return out.view(args[0].shape)
        index = (None,) * start + tuple(args[2:])  # None: the whole dim
        return torch.ops.aten.index_put.default(args[0], list(index), args[1], accumulate)
    if op is Op.SCAN:
        return scan(args[0], node.arg)
    if op is Op.SEGMENT_REDUCE:
        return segment_reduce(args[0], args[1], {Op.SUM: "sum", Op.AMAX: "amax", Op.AMIN: "amin"}[node.arg])
    if op is Op.CHUNK_SUM:
        return chunk_sum(args[0], *node.arg, node.dtype)
    if op is Op.MATMUL:
        a, b = args
        if a.is_cuda:  # cuBLAS, 16-bit products summed in float32 (no float32 copies)
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.mm(a.float(), b.float())
    if op is Op.SEARCH:
        return torch.searchsorted(args[0], args[1], right=node.arg[0], out_int32=node.dtype == dt.int32)
    if op is Op.EXTERN:
        call = node.arg
        return call.target(*fill_template(call.args, args, sizes), **fill_template(call.kwargs, args, sizes))
    if op is Op.GETITEM:
        out = args[0]
        for i in node.arg if isinstance(node.arg, tuple) else (node.arg,):
            out = out[i]
        return out
    raise ValueError(f"cannot evaluate {op.value}")


def scan(x: torch.Tensor, arg: Any) -> torch.Tensor:
    """Op.SCAN: eager's cumsum / cumprod / logcumsumexp / cummax / cummin's values (16-bit floats
    accumulate in float32)."""
    fn = {"sum": torch.cumsum, "prod": torch.cumprod, "logsumexp": torch.logcumsumexp,
          "max": lambda x, d: torch.cummax(x, d).values, "min": lambda x, d: torch.cummin(x, d).values}[arg.combine]
    if arg.reverse:
        return fn(x.flip(arg.dim), arg.dim).flip(arg.dim)
    return fn(x, arg.dim)


def chunk_sum(x: torch.Tensor, lead: int, chunks: int, dtype: dt.DType) -> torch.Tensor:
    """Op.CHUNK_SUM: sums of the flattened leading rows in ``chunks`` runs of ceil(R / chunks)."""
    n = math.prod(x.shape[:lead])
    rows = x.reshape(n, *x.shape[lead:]).to(dt.to_torch(dtype))
    per = -(-n // chunks)
    padded = torch.nn.functional.pad(rows, [0, 0] * (rows.dim() - 1) + [0, per * chunks - n])
    return padded.reshape(chunks, per, *rows.shape[1:]).sum(1)


def _reduce(op: Op, x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    if op is Op.SUM:
        return torch.sum(x, dims, keepdim=True, dtype=x.dtype)
    if op in (Op.AMAX, Op.AMIN):
        if any(x.shape[d] == 0 for d in dims):
            # a kernel's max starts from its identity and keeps it over no elements (a segment
            # max over an empty batch); ATen's amax refuses them
            shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
            return torch.full(shape, identity(op.value, x.dtype), dtype=x.dtype, device=x.device)
        return (torch.amax if op is Op.AMAX else torch.amin)(x, dims, keepdim=True)
    if op in (Op.ANY, Op.ALL):
        return (torch.any if op is Op.ANY else torch.all)(x, dims, keepdim=True)
    if op is Op.PROD:
        for d in dims:
            x = torch.prod(x, d, keepdim=True, dtype=x.dtype)
        return x
    # argmax/argmin over several dims: move them last, flatten, reduce, put the 1s back.
    keep = [d for d in range(x.dim()) if d not in dims]
    # (the reduced length spelled out: -1 is ambiguous where a kept dim is 0)
    flat = x.permute(keep + list(dims)).reshape([x.shape[d] for d in keep] + [math.prod(x.shape[d] for d in dims)])
    fn = torch.argmax if op is Op.ARGMAX else torch.argmin
    return fn(flat, -1, keepdim=False).reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])


def run_graph(graph: Graph, args: Sequence[Any], sizes: Sizes) -> list[Any]:
    """Evaluate a whole graph with torch (the reference the tests compare kernels against)."""
    env: dict[Node, Any] = {}
    for node, value in zip(graph.inputs, args):
        env[node] = value
    for node in graph.nodes:
        if node in env:
            continue
        env[node] = eval_node(node, [env[i] for i in node.inputs], sizes)
    return [None if o is None else env[o] for o in graph.outputs]
