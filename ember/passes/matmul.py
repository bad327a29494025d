"""Matmuls with epilogues: ``aten.mm`` / ``aten.addmm`` calls whose result feeds pointwise ops
become ``Op.MATMUL`` nodes, which the planner fuses with those ops into one kernel (the Triton
backend's tiled matmul, schedule/fusion.py and codegen/triton_matmul.py, or on Hopper GPUs the
ping-pong kernel of codegen/cuda_matmul.py).

cuBLAS then no longer writes the product for another kernel to read back: silu(x @ Wg) * (x @ Wu)
computes both products in one kernel, reading x once, and stores neither. ``addmm``'s bias joins
the epilogue: the float32 sums plus the bias are rounded once, as cuBLAS rounds them.

Which matmuls (the ``matmul_epilogues`` option): 'auto', the default, rewrites matmuls that share
their first operand with another of the same shape (a gated MLP's two projections, parallel
projections of one input), and on a Hopper GPU (compute capability 9.0) a matmul alone too: its
kernel is then a hand-written warp-specialized ping-pong kernel (codegen/cuda_matmul.py) whose
epilogue runs while the other consumer's products do. Against Inductor (cuBLAS plus an epilogue
kernel) that was 1.09x-1.21x on one H200, 0.97-0.98x on another, whose cuBLAS was faster, and
0.95-1.07x over three H100 calls; it beat Triton's fused kernel in 6 of 8 comparisons, by up to
7%, and lost 2 by 2% (bench/hopper_gemm.py, bench/RESULTS.md). Elsewhere a lone matmul stays
cuBLAS's, its epilogue a kernel of its own: Triton's fused kernel does not overlap gelu's math
with the next tile's products (0.96x at 8192 x 4096 x 4096 on an H100, bench/matmul_sweep.py).
Two products sharing their loads come out ahead on device time (silu·mul: the fused kernel
2169 µs, cuBLAS's two products alone 2 x 1083-1101 before their epilogue kernel) and at parity
in wall time (0.99-1.04x Inductor over two runs; bench/RESULTS.md, ninth run); on a Hopper GPU
the template computes such a pair too, when the two are alone in their kernel (1948 µs against
Triton's 1954 and Inductor's 1998 at 8192 x 4096 x 11008 on an H200). 'all' rewrites every
matmul with an epilogue; 'off' none. The CUDA backend's matmul kernels are the Hopper template
only: it rewrites, on Hopper GPUs (and for ``explain``'s renders), lone matmuls and pairs
sharing their first operand whose epilogues meet only each other's; nothing elsewhere. Neither
backend's 'auto' takes a matmul whose kernel would store two tensors or more (``_stores``): a
training forward that saves the product for the backward (see ``_chosen``).

Under 'auto' the driver plans a graph this pass rewrote a second time with 'off', and the
graph's first calls time both (runtime/choice.py): gelu(x @ W + b) at 8192 x 4096 x 4096 was
454 µs fused against cuBLAS plus an epilogue kernel's 396-400 on one H200, and the gated MLP's
1976 against 2025-2036; the faster is kept per size bucket.

Only 16-bit float matmuls are rewritten (float32 matmuls keep cuBLAS's exact float32 products; a
Triton dot would round them to TF32), only where the kernel would compute some pointwise op
besides casts from the product, directly or through views (a plain product, or one only cast to
float32 for a loss, is cuBLAS's to compute; ``_epilogue``, ``_computes``), and only when no dim
is statically below 16 (a tile's smallest side).
"""

from __future__ import annotations

import functools
import importlib.util

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import ArgRef, ExternCall, Graph, Node, aten_result_strides, make, rewrite
from ..ir.ops import POINTWISE_OPS, VIEW_OPS, Op
from ..ir.strides import compose_strided

aten = torch.ops.aten
MIN_SIDE = 16  # tl.dot's smallest block side
_LOW = (dt.float16, dt.bfloat16)


def _backend(node: Node, target: str | None, gpu_backend: str) -> str:
    """The backend that renders ``node``'s kernels."""
    return target or (gpu_backend if node.device.startswith("cuda") else "cpp")


def _is_mm(call: ExternCall) -> bool:
    """A plain ``aten.mm(a, b)`` call."""
    return call.target is aten.mm.default and call.args == (ArgRef(0), ArgRef(1)) and not call.kwargs


def _operands(node: Node) -> tuple[Node | None, Node, Node] | None:
    """(bias or None, a, b) of an mm or addmm call ember can generate, else None."""
    if node.op is not Op.EXTERN or node.shape is None:
        return None
    call = node.arg
    if _is_mm(call):
        bias, (a, b) = None, node.inputs
    elif (call.target is aten.addmm.default and call.args == (ArgRef(0), ArgRef(1), ArgRef(2))
          and all(call.kwargs.get(k, 1) == 1 for k in ("beta", "alpha")) and set(call.kwargs) <= {"beta", "alpha"}):
        bias, a, b = node.inputs
        if bias.dtype != a.dtype or bias.rank > 2:
            return None
    else:
        return None
    if a.rank != 2 or b.rank != 2 or a.dtype not in _LOW or b.dtype != a.dtype or node.dtype != a.dtype:
        return None
    for size in (a.shape[0], a.shape[1], b.shape[1]):
        n = sh.static(size)
        if n is not None and n < MIN_SIDE:
            return None
    return bias, a, b


def _strides(node: Node) -> tuple[sympy.Expr, ...] | None:
    """``node``'s element strides as a kernel reads it: a graph input's own, an ATen result's
    as eager lays it out, a kernel's result contiguous, and a view of any of those (permutes,
    slices, reshapes, expands) composed as torch composes them. None where a reshape of it is no
    view (a kernel then reads it through index arithmetic)."""
    if node.op in VIEW_OPS:
        base = _strides(node.inputs[0])
        composed = None if base is None else compose_strided(node, (tuple(base), sympy.Integer(0)))
        return None if composed is None else composed[0]
    if node.op is Op.INPUT:
        return tuple(node.arg.strides)
    return tuple(aten_result_strides(node) or sh.contiguous_strides(node.shape))


def _tma_readable(operand: Node) -> bool:
    """Can the Hopper template read ``operand`` with TMA: a dim of unit stride (rows or columns
    contiguous), and no dim broadcast (a stride of 0)? Otherwise (``x[:, ::2]``, a transpose of
    that, a reshape that is no view, ``w.expand(k, n)``) the template refused the kernel at
    build time (a warning, its ops through ATen) or sent every call to ATen; cuBLAS takes any.
    (Alignment is the call's to check: the launcher sends a misaligned call to ATen.)"""
    strides = _strides(operand)
    if strides is None:
        return False
    real = [sympy.sympify(st) for st, size in zip(strides, operand.shape) if not sh.is_one(size)]
    return any(st == 1 for st in real) and not any(st == 0 for st in real)


def _epilogue(node: Node, users: dict[Node, list[Node]]) -> set[Node]:
    """``node`` and the pointwise ops and views its kernel can compute from its product: those
    whose other inputs do not come from the product by another way (a softmax's ``x - max(x)``
    waits for a reduction of it: another kernel's)."""
    below, stack = set(), [node]  # everything computed from the product
    while stack:
        for u in users.get(stack.pop(), ()):
            if u not in below:
                below.add(u)
                stack.append(u)
    epilogue, stack = {node}, [node]
    while stack:
        for u in users.get(stack.pop(), ()):
            if (u not in epilogue and (u.op in POINTWISE_OPS or u.op in VIEW_OPS)
                    and all(i in epilogue or i not in below for i in u.inputs)):
                epilogue.add(u)
                stack.append(u)
    return epilogue


def _computes(epilogue: set[Node]) -> bool:
    """Does an epilogue compute something, a pointwise op other than a cast? Casts alone would
    only store the product wider: a GPT's logits cast to float32 for its loss took the Hopper
    kernel 727 µs a step where cuBLAS stores them in bf16 in 543, and the loss kernel then read
    twice the bytes (H200, bench/gpt_step.py); its kernel casts them as it reads."""
    return any(n.op in POINTWISE_OPS and n.op is not Op.CAST for n in epilogue)


def _stores(epilogue: set[Node], users: dict[Node, list[Node]], outputs: set[Node]) -> int:
    """How many tensors a matmul's kernel with ``epilogue`` must store: the values in it that are
    graph outputs or ATen calls' inputs, directly or through views. A training forward saves
    ``x @ W + b`` for gelu's backward beside gelu's result: 2."""

    def in_memory(n: Node) -> bool:
        return n in outputs or any(u.op is Op.EXTERN or u.op in VIEW_OPS and in_memory(u) for u in users.get(n, ()))

    return sum(1 for n in epilogue if n.op not in VIEW_OPS and in_memory(n))


@functools.cache
def _hopper_gpu(device: str) -> bool:
    """Is ``device`` a compute capability 9.0 GPU that ember's Hopper matmul kernels can run on
    (cuda-python present: they are launched through the driver API)?"""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return False
    index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
    return (torch.cuda.get_device_capability(index) == (9, 0)
            and importlib.util.find_spec("cuda") is not None)


def _hopper(node: Node, target: str | None) -> bool:
    """Does ``node`` run on a Hopper GPU, or is it rendered for the CUDA backend with no GPU
    (``explain``: the CUDA backend renders matmuls for Hopper)? A Triton render with no GPU
    (the interpreter) keeps Triton's matmul kernels."""
    return _hopper_gpu(node.device) or (target == "cuda" and not node.device.startswith("cuda"))


def _epilogue_of(node: Node, users: dict[Node, list[Node]]) -> set[Node]:
    """The pointwise ops and views ``node``'s result reaches through pointwise ops and views:
    what its kernel's epilogue may take in."""
    seen: set[Node] = set()
    stack = list(users.get(node, ()))
    while stack:
        u = stack.pop()
        if u not in seen and (u.op in POINTWISE_OPS or u.op in VIEW_OPS):
            seen.add(u)
            stack.extend(users.get(u, ()))
    return seen


def _chosen(graph: Graph, target: str | None, gpu_backend: str, mode: str) -> set[Node]:
    """The matmul calls to rewrite: those with an epilogue. On the Triton backend with ``mode``
    'auto', those sharing their first operand with another of the same (M, N, K), whose kernel
    then reads that operand once for both products (silu(x @ Wg) * (x @ Wu)), and on a Hopper GPU
    also a matmul alone, whose kernel is then the Hopper template (codegen/cuda_matmul.py); with
    'all', every one. On the CUDA backend, whose matmul kernels are that template, those on a
    Hopper GPU whose kernel the template computes: a matmul alone (its epilogue meets no other
    matmul's, so its kernel has one product), or two whose epilogues meet only each other's and
    that share their first operand.

    'auto' leaves out a matmul whose kernel would store two tensors or more (a training forward
    saves the product, or the product plus a bias, for the backward beside the epilogue's
    result): that saves only the epilogue kernel's reading the product back, and cost more than
    that on an H200 (a gelu(x @ W + b) forward that also stored x @ W + b: 441-451 µs against
    cuBLAS's 340-350 plus Inductor's epilogue kernel; bench/RESULTS.md, thirty-fourth-run session)."""
    users = graph.users()
    outputs = {o for o in graph.outputs if o is not None}
    found: list[tuple[Node, Node, str]] = []
    for node in graph.nodes:
        backend = _backend(node, target, gpu_backend)
        operands = _operands(node) if backend in ("triton", "cuda") else None
        if operands is None:
            continue
        epilogue = _epilogue(node, users)
        if _computes(epilogue) and (mode == "all" or _stores(epilogue, users, outputs) < 2):
            found.append((node, operands[1], backend))
    # (the same first operand means the same M and K)
    paired = {node for node, a, _ in found
              if any(other is not node and a2 is a and sh.shapes_equal(node.shape, other.shape)
                     for other, a2, _ in found)}
    # (wider than ``_epilogue``: a residual stream's additions join a GPT's projections, so none
    # of them is a lone matmul. With the narrower epilogues, 13 of a 2-layer GPT's training
    # products would become Hopper kernels at K = 768, where the template's short mainloop leaves
    # its epilogue unhidden; not measured)
    reach = {node: _epilogue_of(node, users) for node, _, _ in found}
    meets = {node: [other for other, _, _ in found if other is not node and reach[node] & reach[other]]
             for node, _, _ in found}
    first = {node: a for node, a, _ in found}

    def one_template_kernel(node: Node) -> bool:
        """Does ``node``'s kernel hold one product, or two of the same shape sharing their first
        operand (a gated MLP's): what the Hopper template computes?"""
        if len(meets[node]) != 1:
            return not meets[node]
        other = meets[node][0]
        return meets[other] == [node] and first[other] is first[node] and sh.shapes_equal(node.shape, other.shape)

    chosen = set()
    for node, _, backend in found:
        hopper = _hopper(node, target) and one_template_kernel(node)
        if (backend == "cuda" or hopper) and not all(_tma_readable(x) for x in _operands(node)[1:]):
            # (the template's only way in is TMA, and on a Hopper GPU the Triton backend hands
            # it these kernels too; cuBLAS takes any strides, decided here once, not per call)
            continue
        if backend == "cuda" and hopper or backend == "triton" and (mode == "all" or node in paired or hopper):
            chosen.add(node)
    return chosen


def matmul_epilogues(graph: Graph, target: str | None = None, gpu_backend: str = "triton",
                     mode: str = "auto") -> Graph:
    """``target``: the backend kernels are rendered for whatever the device (``explain``, tests
    under the Triton interpreter); None: ``gpu_backend`` for CUDA graphs, C++ for CPU ones.
    ``mode``: 'auto' (matmuls sharing an operand) or 'all' (every matmul with an epilogue)."""
    chosen = _chosen(graph, target, gpu_backend, mode)

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node not in chosen:
            return None
        bias, a, b = inputs if len(inputs) == 3 else (None, *inputs)
        total = make(Op.MATMUL, (a, b), origin=node.origin)
        if bias is not None:
            if bias.rank < 2:
                bias = make(Op.RESHAPE, (bias,), (1,) * (2 - bias.rank) + tuple(bias.shape))
            if not sh.shapes_equal(bias.shape, total.shape):
                bias = make(Op.EXPAND, (bias,), tuple(total.shape))
            bias = make(Op.CAST, (bias,), dtype=dt.float32, origin=node.origin)
            total = make(Op.ADD, (total, bias), origin=node.origin)
        return make(Op.CAST, (total,), dtype=node.dtype, origin=node.origin)

    return rewrite(graph, rule)


def _folds(mm: Node, users: dict[Node, list[Node]], outputs: set[Node]) -> bool:
    """A 2-d ``aten.mm`` whose only use is one addition (so its product need not be stored)."""
    if mm.op is not Op.EXTERN or mm.shape is None or mm.rank != 2 or mm in outputs:
        return False
    return _is_mm(mm.arg) and len(users.get(mm, ())) == 1


def fold_matmul_adds(graph: Graph, target: str | None = None, gpu_backend: str = "triton") -> Graph:
    """``mm(a, b) + c`` as ``addmm(c, a, b)`` on GPUs: cuBLAS adds c as it stores the product, so
    the product is never stored and read back by an addition kernel (a backward's
    dx = dg @ Wg.T + du @ Wu.T: one product, then the other added into it). ``c`` must already be
    a tensor in memory (an input, an ATen result) of the product's shape and dtype; the sum is
    rounded once, as with a bias."""
    users = graph.users()
    outputs = {o for o in graph.outputs if o is not None}

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node.op is not Op.ADD or _backend(node, target, gpu_backend) == "cpp":
            return None
        for i in (0, 1):
            mm, other = node.inputs[i], inputs[1 - i]
            if (_folds(mm, users, outputs) and other.op in (Op.INPUT, Op.EXTERN, Op.GETITEM)
                    and other.dtype == node.dtype == mm.dtype and sh.shapes_equal(other.shape, node.shape)):
                a, b = inputs[i].inputs
                call = ExternCall(aten.addmm.default, (ArgRef(0), ArgRef(1), ArgRef(2)))
                return make(Op.EXTERN, (other, a, b), call, dtype=node.dtype, shape=node.shape,
                            device=node.device, origin="aten.addmm")
        return None

    return rewrite(graph, rule)
