"""Column sums as partial sums over runs of rows, so the row kernel beside them can compute them.

A norm's backward needs two reductions of the same (rows, width) product: per row, for dx, and
per column, for dw (``sum(dy * xhat, 0)``). One kernel cannot walk memory both ways, so compilers
used to read x and dy twice. This pass rewrites such a column sum as ``sum(chunk_sum(x), 0)``: a
chunk sum adds the rows of each of a fixed number of runs (``chunks``), which is what a row
kernel's program (or thread) can accumulate while it walks its run of rows. The planner puts the
chunk sum into the row kernel that reads the same inputs (schedule/fusion.py), and a small kernel
adds up the partials, (chunks x width) floats instead of a second pass over the inputs.

It applies to float sums over the leading dims whose input shape a reduction over the other dims
also reads, sharing an input with it, and with at least four rows per run (or a symbolic count);
not where such a reduction needs the column sum whole (reads it, or a value reads both), since
the chunk sum could not join its kernel.
"""

from __future__ import annotations

import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import Graph, Node, make, rewrite
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, VIEW_OPS, Op

# Runs per SM: a Triton program walks its run's rows one after another with the row in
# registers. H200, RMSNorm backward 16384 x 4096 bf16, its two kernels (bench/chunk_sweep.py):
# 2, 4 and 8 runs per SM took 132, 149 and 154 us with Triton, 405, 300 and 297 us with the CUDA
# backend, whose blocks keep fewer bytes in flight each. The partials' sum over 4 and 8 runs per
# SM took most of Triton's difference then: split over programs (runtime/triton_configs.py) it
# took 7.8 and 19.8 us against 2.8. Unsplit it takes 4.1 and 7.4, and RMSNorm's two kernels
# 149 us at 2 runs per SM against 116 at 4 (the row kernel 146.2 -> 111.5, more programs to
# hide its latency). LayerNorm's, whose row kernel keeps two columns' partials, took 136 against
# 142: a row kernel with one column sum (RMSNorm's dw) takes CHUNKS_PER_SM_ONE_SUM.
CHUNKS_PER_SM = 2
CHUNKS_PER_SM_ONE_SUM = 4
CUDA_CHUNKS_PER_SM = 4
CHUNKS_PER_THREAD = 4      # CPU: runs per OpenMP thread (each run's partials stay in its cache)
FALLBACK_SMS = 132         # an H100/H200, when no GPU is visible (explain(target="cuda") on a laptop)


def chunk_count(device: str, per_sm: int = CHUNKS_PER_SM) -> int:
    """How many runs the rows split into on ``device``: enough to fill it, few enough that the
    partials (chunks x width) stay small next to the rows."""
    if device.startswith("cuda"):
        sms = FALLBACK_SMS
        if torch.cuda.is_available():
            index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
            sms = torch.cuda.get_device_properties(index).multi_processor_count
        return per_sm * sms
    return CHUNKS_PER_THREAD * max(1, torch.get_num_threads())


def _leaves(node: Node, memo: dict[Node, frozenset[Node]]) -> frozenset[Node]:
    """The tensors (inputs, ATen results) ``node`` is computed from through pointwise ops and views
    (iteratively: pointwise chains can be longer than Python's recursion limit)."""
    stack = [node]
    while stack:
        n = stack[-1]
        if n in memo:
            stack.pop()
            continue
        if n.op in POINTWISE_OPS or n.op in VIEW_OPS:
            pending = [i for i in n.inputs if i not in memo]
            if pending:
                stack.extend(pending)
                continue
            memo[n] = frozenset().union(*(memo[i] for i in n.inputs))
        else:
            memo[n] = frozenset((n,)) if n.op in (Op.INPUT, Op.EXTERN, Op.GETITEM, Op.TENSOR) else frozenset()
        stack.pop()
    return memo[node]


def _lead(node: Node) -> int | None:
    """How many leading dims a float sum reduces, when it reduces exactly those (and keeps some)."""
    if node.op is not Op.SUM or not node.dtype.is_float:
        return None
    x = node.inputs[0]
    dims = sorted(d for d in node.arg if not sh.is_one(x.shape[d]))
    lead = max(dims, default=-1) + 1
    kept = x.shape[lead:]
    if not dims or lead >= x.rank or all(sh.is_one(s) for s in kept) or len(set(node.arg)) != len(node.arg):
        return None
    if any(d not in node.arg and not sh.is_one(x.shape[d]) for d in range(lead)):
        return None
    return lead


def _after(column_sum: Node, row_reduction: Node, users: dict[Node, list[Node]], reach: dict) -> bool:
    """Would the row kernel of ``row_reduction`` need ``column_sum`` whole? Where the row
    reduction reads it, or a pointwise value reads both (one kernel computes it, beside the row
    reduction), the chunk sum cannot join that kernel: it ran as a kernel of its own (H100,
    ``(x * w).sum(0) + x.amax(1)`` over 4096 x 4096: 158 µs against Inductor's 25 for its split
    column sum; bench/square_reductions.py)."""
    down = _downstream(column_sum, users, reach, through_reductions=True)
    return row_reduction in down or bool(down & _downstream(row_reduction, users, reach))


def _downstream(node: Node, users: dict[Node, list[Node]], reach: dict,
                through_reductions: bool = False) -> frozenset[Node]:
    """The nodes that read ``node`` through pointwise ops and views (and reductions too, with
    ``through_reductions``: what needs it whole)."""
    key = (node, through_reductions)
    if key in reach:
        return reach[key]
    passes = POINTWISE_OPS | VIEW_OPS | (REDUCE_OPS if through_reductions else frozenset())
    found: set[Node] = set()
    stack = list(users.get(node, ()))
    while stack:
        n = stack.pop()
        if n in found:
            continue
        found.add(n)
        if n.op in passes:
            stack.extend(users.get(n, ()))
    reach[key] = frozenset(found)
    return reach[key]


def chunk_column_sums(graph: Graph, chunks: int | None = None, per_sm: int = CHUNKS_PER_SM,
                      target: str | None = None, per_sm_one_sum: int | None = None) -> Graph:
    """``chunks``: the runs of rows (None: ``chunk_count`` of the graph's device, ``per_sm`` runs
    per SM on a GPU, ``per_sm_one_sum`` where a column sum is the only one beside its row
    reductions; 0: no rewrite). ``target``: the backend rendering the kernels (None: the
    device's own)."""
    if chunks == 0:
        return graph
    memo: dict[Node, frozenset[Node]] = {}
    reductions = [n for n in graph.nodes if n.op in REDUCE_OPS]
    row_reductions: list[tuple[Node, frozenset[int]]] = [
        (n.inputs[0], frozenset(d for d in n.arg if not sh.is_one(n.inputs[0].shape[d]))) for n in reductions]
    chunks_of: dict[tuple[str, int], int] = {}

    users = graph.users()
    reach: dict = {}  # (node, through reductions) -> its downstream

    def partners(node: Node, x: Node, lead: int) -> list[int]:
        """The reductions over the kept dims of a tensor shaped like ``x``, from a shared input
        (indices into ``row_reductions``); none where one of them needs the column sum ``node``
        whole (the planner puts reductions of one domain in one kernel, which the chunk sum
        then cannot join)."""
        kept = frozenset(d for d in range(lead, x.rank) if not sh.is_one(x.shape[d]))
        mine = _leaves(x, memo)
        found = [i for i, (y, dims) in enumerate(row_reductions)
                 if sh.shapes_equal(y.shape, x.shape) and dims == kept and mine & _leaves(y, memo)]
        return [] if any(_after(node, reductions[i], users, reach) for i in found) else found

    # the column sums beside each row reduction: a row kernel holding one column's partials has
    # registers for more programs on an SM
    column_sums: dict[Node, list[int]] = {}  # -> the row reductions beside it
    for n in graph.nodes:
        lead = _lead(n)
        if lead is not None:
            found = partners(n, n.inputs[0], lead)
            if found:
                column_sums[n] = found
    sums_beside = [sum(i in found for found in column_sums.values()) for i in range(len(row_reductions))]

    def rule(node: Node, inputs: tuple[Node, ...]) -> Node | None:
        if node not in column_sums:
            return None
        lead = _lead(node)
        (x,) = inputs
        alone = per_sm_one_sum is not None and all(sums_beside[i] == 1 for i in column_sums[node])
        per = per_sm_one_sum if alone else per_sm
        if (node.device, per) not in chunks_of:
            chunks_of[(node.device, per)] = chunks or chunk_count(node.device, per)
        runs = chunks_of[(node.device, per)]
        if runs <= 1:
            return None  # one run is one kernel's sums: as off (a (1, W) partial had no inner loop)
        rows = sh.static(sh.numel(x.shape[:lead]))
        if rows is not None and rows < 4 * runs:
            return None  # too few rows to split (the partials would rival the input): one kernel sums them
        acc = dt.compute_dtype(x.dtype)
        if acc == dt.float32 and (target or ("cpp" if node.device == "cpu" else None)) == "cpp":
            # in double, as the C++ backend adds every float32 sum: a run adds rows / chunks
            # values one after another, and float32 partials drifted (1e-3 off, 2^20 rows of 0.1)
            acc = dt.float64
        parts = make(Op.CHUNK_SUM, (x,), (lead, runs), dtype=acc, origin=node.origin)
        total = make(Op.SUM, (parts,), (0,), origin=node.origin)
        if acc != node.dtype:
            total = make(Op.CAST, (total,), dtype=node.dtype, origin=node.origin)
        if not sh.shapes_equal(total.shape, node.shape):
            total = make(Op.RESHAPE, (total,), node.shape)
        return total

    return rewrite(graph, rule)
