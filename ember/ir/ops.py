"""The op enum: every operation an ember IR node can be, grouped by kind.

Adding an op is one enum entry here, one shape/dtype rule in ``node.py`` (most ops share their
kind's rule), one ATen lowering in ``frontend/lowering.py`` and one spelling per backend in
``codegen``, or a decomposition into ops that already exist.
"""

from __future__ import annotations

from enum import Enum


class Op(Enum):
    # --- leaves ---------------------------------------------------------------------------------
    INPUT = "input"            # graph input; arg: InputSpec
    CONST = "const"            # 0-d constant; arg: python number or sympy expression of sizes
    TENSOR = "tensor"          # a constant tensor the compiled program holds; arg: TensorConst
    IOTA = "iota"              # 1-d arange; arg: (start, step)

    # --- movement: pure index remapping, never a kernel of their own ------------------------------
    RESHAPE = "reshape"        # arg: new shape (row-major reinterpretation)
    PERMUTE = "permute"        # arg: dims
    EXPAND = "expand"          # arg: new shape (size-1 dims broadcast)
    SLICE = "slice"            # arg: (dim, start, step); output shape gives the length

    # --- pointwise, one input -------------------------------------------------------------------
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    ERFC = "erfc"
    ONE_PLUS_ERF = "one_plus_erf"  # 1 + erf(x), float32 only (passes/erf.py): a GELU's factor
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"            # half to even, as torch.round
    TRUNC = "trunc"
    SIGN = "sign"
    NOT = "logical_not"
    BITNOT = "bitwise_not"
    ISNAN = "isnan"
    ISINF = "isinf"
    SIGNBIT = "signbit"        # the sign bit of a float (-0.0 and -NaN too): bool
    CAST = "cast"              # to node.dtype

    # --- pointwise, two inputs ------------------------------------------------------------------
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"                # true division (floats)
    FLOORDIV = "floordiv"      # div(rounding_mode='floor')
    TRUNCDIV = "truncdiv"      # div(rounding_mode='trunc')
    MOD = "remainder"          # Python-style remainder (sign of divisor)
    FMOD = "fmod"              # C-style remainder (sign of dividend)
    POW = "pow"
    MAX = "maximum"            # NaN-propagating, as torch.maximum
    MIN = "minimum"
    ATAN2 = "atan2"
    HYPOT = "hypot"
    COPYSIGN = "copysign"      # |a| with b's sign bit (-0.0 and a NaN's sign too)
    NEXTAFTER = "nextafter"    # the float after a towards b (float32, float64)
    GCD = "gcd"                # integers, as ATen's calc_gcd (gcd(INT_MIN, 0) is INT_MIN)
    LCM = "lcm"                # integers, |a / gcd * b| wrapping in C's promoted type, as ATen
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    AND = "logical_and"
    OR = "logical_or"
    XOR = "logical_xor"
    BITAND = "bitwise_and"
    BITOR = "bitwise_or"
    BITXOR = "bitwise_xor"
    SHL = "shl"
    SHR = "shr"

    # --- pointwise, three inputs ----------------------------------------------------------------
    WHERE = "where"            # (cond, a, b)

    # --- reductions: arg = sorted tuple of reduced dims; output keeps them as size 1 --------------
    SUM = "sum"
    PROD = "prod"
    AMAX = "amax"
    AMIN = "amin"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    ANY = "any"
    ALL = "all"

    # --- scans: arg = ScanArg (combine, dim, reverse); output = input's shape and dtype -----------
    SCAN = "scan"              # out[.., i, ..] = x[.., 0, ..] (+) .. (+) x[.., i, ..] along dim (from the
    #                            end when reverse): cumsum, cumprod, logcumsumexp, and cummax,
    #                            cummin's values (eager's tie and NaN rule). 16-bit floats
    #                            accumulate in float32 and round each result, as eager does

    # --- data-dependent indexing ----------------------------------------------------------------
    GATHER = "gather"          # (x, index), arg: dim. out[p] = x[p with p[dim] = index[p]]
    INDEX = "index"            # (x, i0, .., ik-1), arg: first indexed dim d; indices of one shape I,
    #                            in range: out[a, j, b] = x[a, i0[j], .., ik-1[j], b], len(a) = d
    SEARCH = "search"          # (seq, values), arg: (right, ragged). seq 1-d, sorted: out[p] = how
    #                            many elements of seq are < values[p] (<= when right): searchsorted;
    #                            ragged: a Ragged's row ids (ir.node.row_ids_offsets)
    INDEX_PUT = "index_put"    # (x, src, i0, .., ik-1), arg: (first indexed dim d, accumulate, error
    #                            code of a bad index). The inverse of INDEX: out = x, then
    #                            out[a, i0[j], .., b] = src[a, j, b] (+= when accumulating: atomic adds)
    SEGMENT_REDUCE = "segment_reduce"  # (x, offsets), arg: SUM, AMAX or AMIN. x (T, ...) packed rows,
    #                            offsets (B+1,) sorted: out[b] = reduce(x[offsets[b]:offsets[b+1]],
    #                            dim 0), the identity for an empty row
    CHUNK_SUM = "chunk_sum"    # (x,), arg: (lead, chunks). x (*L, *K) with len(L) = lead: the
    #                            rows (L flattened, R of them) in ``chunks`` runs of ceil(R / chunks):
    #                            out[c, k] = sum of x[i, k] over the rows i of run c (float sums)
    MATMUL = "matmul"          # (a, b): a (M, K) @ b (K, N), both float16 or both bfloat16: the float32
    #                            sums of products (a cast rounds them, once, as cuBLAS does). Only
    #                            passes/matmul.py builds it, for the Triton backend
    CAT = "cat"                # (x0, x1, ...), arg: dim
    PAD = "pad"                # (x, value), arg: ((lo, hi) per dim); value is 0-d

    # --- computed by ATen inside the compiled program -------------------------------------------
    EXTERN = "extern"          # arg: ExternCall
    GETITEM = "getitem"        # arg: index into a multi-output EXTERN

    def __repr__(self) -> str:
        return f"Op.{self.name}"


LEAF_OPS = frozenset({Op.INPUT, Op.CONST, Op.TENSOR, Op.IOTA})
VIEW_OPS = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE})
UNARY_OPS = frozenset({
    Op.NEG, Op.ABS, Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT,
    Op.RSQRT, Op.RECIPROCAL, Op.SIN, Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH,
    Op.TANH, Op.ASINH, Op.ACOSH, Op.ATANH, Op.SIGMOID, Op.ERF, Op.ERFC, Op.ONE_PLUS_ERF, Op.FLOOR, Op.CEIL,
    Op.ROUND, Op.TRUNC, Op.SIGN, Op.NOT, Op.BITNOT, Op.ISNAN, Op.ISINF, Op.SIGNBIT, Op.CAST,
})
BINARY_OPS = frozenset({
    Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.TRUNCDIV, Op.MOD, Op.FMOD, Op.POW, Op.MAX,
    Op.MIN, Op.ATAN2, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR, Op.XOR,
    Op.BITAND, Op.BITOR, Op.BITXOR, Op.SHL, Op.SHR, Op.HYPOT, Op.COPYSIGN, Op.NEXTAFTER, Op.GCD,
    Op.LCM,
})
TERNARY_OPS = frozenset({Op.WHERE})
POINTWISE_OPS = UNARY_OPS | BINARY_OPS | TERNARY_OPS
SCAN_OPS = frozenset({Op.SCAN})
REDUCE_OPS = frozenset({Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ARGMAX, Op.ARGMIN, Op.ANY, Op.ALL})
EXTERN_OPS = frozenset({Op.EXTERN, Op.GETITEM})

# Results are bool whatever the inputs.
PREDICATE_OPS = frozenset({
    Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR, Op.XOR, Op.NOT, Op.ISNAN, Op.ISINF,
    Op.SIGNBIT,
})
# Float-only math: integer inputs are promoted by the frontend before these are built.
FLOAT_OPS = frozenset({
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SQRT, Op.RSQRT, Op.SIN,
    Op.COS, Op.TAN, Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.TANH, Op.ASINH, Op.ACOSH,
    Op.ATANH, Op.SIGMOID, Op.ERF, Op.ERFC, Op.ONE_PLUS_ERF, Op.DIV, Op.ATAN2, Op.HYPOT, Op.COPYSIGN, Op.NEXTAFTER,
})
# (not max and min: eager's keep their first operand on a tie, so maximum(-0.0, 0.0) is -0.0
# and maximum(0.0, -0.0) is 0.0)
COMMUTATIVE_OPS = frozenset({
    Op.ADD, Op.MUL, Op.EQ, Op.NE, Op.AND, Op.OR, Op.XOR, Op.BITAND, Op.BITOR, Op.BITXOR, Op.HYPOT,
    Op.GCD, Op.LCM,
})
# Expensive enough that recomputing them in several kernels costs more than a buffer would.
TRANSCENDENTAL_OPS = frozenset({
    Op.EXP, Op.EXP2, Op.EXPM1, Op.LOG, Op.LOG2, Op.LOG10, Op.LOG1P, Op.SIN, Op.COS, Op.TAN,
    Op.ASIN, Op.ACOS, Op.ATAN, Op.SINH, Op.COSH, Op.TANH, Op.ASINH, Op.ACOSH, Op.ATANH,
    Op.SIGMOID, Op.ERF, Op.ERFC, Op.ONE_PLUS_ERF, Op.POW, Op.ATAN2, Op.HYPOT, Op.GCD, Op.LCM,
})
