"""Independent lanes of a pointwise kernel, each run by programs of its own.

A foreach op fused over tensors of one size (an optimizer's step over 8 parameters) is one
pointwise kernel whose stores fall into groups that share no loaded value: one group per
parameter. Rendered as one body, every program loads and stores its block of every tensor (SGD
with momentum: 24 load and 16 store streams a program). Rendered in lanes, program p runs group
p // NBLK on block p % NBLK, so each program streams one parameter's three tensors, as
Inductor's combo kernels do; the grid is NBLK times the number of lanes. Values that load nothing
(constants, index arithmetic) belong to no lane: each lane computes those it needs.

Stores that stream a buffer in common stay in one lane: one program reads neighbouring memory
(a q and a v copied out of one qkv row). Lanes cannot race: an output stored over an input
(``schedule/inplace.py``) is computed from every read of that input, so both are in its lane.
"""

from __future__ import annotations

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Value
from .layout import varies

# more lanes than this stay one body: the source (one branch a lane) grows with them, and a
# program's branch chain is walked to its lane. (An Adam step over a GPT's 74 LayerNorm weights
# and biases of 768 floats, one body, was one program streaming 518 tensors in turn: 204 us.)
MAX_LANES = 256
# kernels over fewer elements (static) in all their lanes stay one body: their time is latency,
# not bandwidth (a BatchNorm's running statistics, 64 channels a layer; its 20 counters, one
# element each)
MIN_ELEMENTS = 4096


def _inputs(v: Value) -> tuple[Value, ...]:
    return (*v.srcs, *((v.guard,) if v.guard is not None else ()))


def _lane_order(kernel: Kernel, needed: set[int], loaded: set[int]) -> list[Value]:
    """A lane's values: its loaded ones in the kernel's order, each after the load-free values it
    needs that came before it (constants that lanes share stand where each lane first uses them),
    so lanes that are one computation list it in one order (codegen/cuda_lanes.py)."""
    out: list[Value] = []
    seen: set[int] = set()

    def visit(v: Value) -> None:
        if id(v) not in seen:
            seen.add(id(v))
            for s in _inputs(v):
                if id(s) in needed:
                    visit(s)
            out.append(v)

    for v in kernel.values:
        if id(v) in needed and id(v) in loaded:
            visit(v)
    return out


def lanes_of(kernel: Kernel, min_elements: int = MIN_ELEMENTS, max_lanes: int = MAX_LANES) -> list[list[Value]] | None:
    """The values of a pointwise kernel split into lanes (each in the kernel's order, with the
    load-free values it uses before their first use: ``_lane_order``), or None where it has
    fewer than two groups of stores that share no loaded value and stream no buffer in common,
    more than ``max_lanes``, or fewer elements in all than ``min_elements``."""
    if kernel.inner or kernel.reductions or kernel.scans or sum(v.kind == "store" for v in kernel.values) < 2:
        return None
    n = sh.static(sh.numel(kernel.outer))
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        a, b = find(a), find(b)
        if a != b:
            parent[a] = b

    loaded: set[int] = set()  # values that are loads or use one
    streams: dict[str, int] = {}  # a buffer read along the loop: its first load
    for v in kernel.values:
        heavy = v.kind in ("load", "store") or any(id(s) in loaded for s in _inputs(v))
        if not heavy:
            continue
        loaded.add(id(v))
        parent[id(v)] = id(v)
        for s in _inputs(v):
            if id(s) in loaded:
                union(id(v), id(s))
        if v.kind == "load" and varies(v.arg.index):
            union(id(v), streams.setdefault(v.arg.buffer, id(v)))
    roots: list[int] = []
    for v in kernel.values:
        if v.kind == "store" and find(id(v)) not in roots:
            roots.append(find(id(v)))
    if not 2 <= len(roots) <= max_lanes or n is not None and n * len(roots) < min_elements:
        return None
    lanes: list[list[Value]] = []
    for root in roots:
        needed: set[int] = set()
        stack = [v for v in kernel.values if id(v) in loaded and find(id(v)) == root]
        while stack:
            v = stack.pop()
            if id(v) not in needed:
                needed.add(id(v))
                stack.extend(_inputs(v))
        lanes.append(_lane_order(kernel, needed, loaded))
    # (a loaded value no store uses is dead; it would belong to no lane)
    return lanes
