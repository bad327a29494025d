"""The schedule a fusion plan (fusion.py) becomes: its steps (a generated kernel, an ATen call,
a view replayed with ATen view ops) and their order.

Each step runs after what it reads, and after the ATen calls binding the data-dependent sizes
it uses (an ``.item()``, a nonzero's count); impure ATen calls (random draws, collectives) keep
program order. ``StepOrder`` is the part of the planner that orders them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import sympy

from ..ir import shapes as sh
from ..ir.node import Graph, Node, fill_value
from ..ir.ops import Op
from .group_spec import BufferInfo, GroupSpec
from .kernel_ir import Kernel


@dataclass
class KernelStep:
    kernel: Kernel
    roots: list[Node]
    nodes: list[Node]       # every IR node the kernel computes (for fallback and reports)
    # writes at indices (INDEX_PUT roots): what their buffers hold before the kernel runs, a
    # tensor to copy (graph input, buffer or view) or a number to fill with
    fills: dict[Node, Node | float | int | bool] = field(default_factory=dict)


@dataclass
class ExternStep:
    node: Node              # EXTERN (its GETITEMs are unpacked with it)


@dataclass
class ViewStep:
    node: Node              # a view of a buffered node, replayed with ATen view ops
    base: Node


Step = KernelStep | ExternStep | ViewStep


@dataclass
class Schedule:
    graph: Graph
    steps: list[Step]
    buffers: dict[Node, BufferInfo]
    kernels: list[Kernel] = field(default_factory=list)
    attempts: int = 1   # the planner's tries (each NeedsBuffer or Conflict is one more)
    reused: int = 0     # kernel builds a try took from an earlier one instead of building


def copied_base(put: Node) -> Node:
    """The tensor a write at indices copies into its buffer first: casts are left to the copy
    (``copy_`` converts as a cast does), so a bfloat16 tensor accumulated in float32 needs no
    kernel of its own."""
    base = put.inputs[0]
    while base.op is Op.CAST:
        base = base.inputs[0]
    return base


class StepOrder:
    """The planner's last stage: its groups and their kernels as ordered steps. A mixin of
    ``fusion.Planner``, whose ``subtree`` and ``reads`` it uses."""

    graph: Graph
    order: dict[Node, int]
    users: dict[Node, list[Node]]
    views: dict[Node, Node]

    def _schedule(self, groups: list[GroupSpec], kernels: list[Kernel], infos: dict[Node, BufferInfo]) -> Schedule:
        producer: dict[Node, Step] = {}
        steps: list[Step] = []
        for g, k in zip(groups, kernels):
            nodes = sorted({n for r in g.roots for n in [r, *self.subtree(r)]}, key=self.order.__getitem__)
            fills = {r: self._fill_source(r) for r in g.roots if r.op is Op.INDEX_PUT}
            step = KernelStep(k, g.roots, nodes, fills)
            for r in g.roots:
                producer[r] = step
        for node in self.graph.nodes:
            if node.op is Op.EXTERN:
                step = ExternStep(node)
                producer[node] = step
                for u in self.users[node]:
                    if u.op is Op.GETITEM:
                        producer[u] = step
        for view, base in self.views.items():
            producer[view] = ViewStep(view, base)

        # order steps so each runs after what it reads
        placed: set[int] = set()
        done: set[int] = set()

        def place(step: Step) -> None:
            if id(step) in placed:
                if id(step) not in done:  # a kernel would read a buffer before it is written
                    raise RuntimeError("ember: kernels that need each other's results")
                return
            placed.add(id(step))
            for dep in self._step_reads(step):
                if dep in producer:
                    place(producer[dep])
            steps.append(step)
            done.add(id(step))

        for node in self.graph.nodes:
            if node in producer:
                place(producer[node])
        return Schedule(self.graph, steps, infos, kernels)

    def _fill_source(self, put: Node) -> Node | float | int | bool:
        value = fill_value(put.inputs[0])
        return value if value is not None else copied_base(put)

    def _step_reads(self, step: Step) -> list[Node]:
        """What ``step`` needs to have run: what it reads, and the ATen calls that bind the
        sizes it uses (a size only the data knows, from ``.item()`` or a result's shape: nothing
        need read the call's value)."""
        if isinstance(step, KernelStep):
            copied = {x for x in step.fills.values() if isinstance(x, Node)}
            reads = sorted(({x for r in step.roots for x in self.reads(r)} | copied) - set(step.roots),
                           key=self.order.__getitem__)
            symbols = set(step.kernel.sizes) | _symbols(set(step.nodes))
        elif isinstance(step, ExternStep):
            reads = list(step.node.inputs)
            if step.node in self._impure_before:  # random draws and collectives keep program order
                reads.append(self._impure_before[step.node])
            symbols = _symbols({step.node}) | _template_symbols((step.node.arg.args, step.node.arg.kwargs))
        else:
            reads = [step.base]
            symbols = _symbols({step.node})
        return reads + [b for b in self._binders_of(symbols) if b is not getattr(step, "node", None)]

    def _binders_of(self, symbols: set[sympy.Symbol]) -> set[Node]:
        """The ATen calls that bind ``symbols`` (those the data decides)."""
        return {self._size_binders[s] for s in symbols if s in self._size_binders}

    @functools.cached_property
    def _impure_before(self) -> dict[Node, Node]:
        """Each impure ATen call's previous one in program order. Collectives must be issued in
        the same order on every rank (ranks whose plans differ, a last batch of one row, had
        swapped two all-reduces), and random ops draw from the generator in eager's order."""
        calls = [n for n in self.graph.nodes if n.op is Op.EXTERN and n.arg.impure]
        return dict(zip(calls[1:], calls[:-1]))

    @functools.cached_property
    def _size_binders(self) -> dict[sympy.Symbol, Node]:
        """The ATen call binding each size the data decides: an ``.item()``, or the first call
        whose result's shape has it (nonzero's count, used as ``x * nz.shape[0]``). Not one an
        input carries (``.item()`` of a 0-d input): a call whose result has that size
        (``x.new_full((k.item(), 2), 2.0).cumsum(0)``) reads it too, and taking it for the binder
        made the kernel it reads wait for it: a cycle."""
        binders: dict[sympy.Symbol, Node] = {}
        carried = _input_symbols(self.graph)
        for n in self.graph.nodes:
            if n.op is Op.EXTERN and n.arg.binds is not None:
                binders.setdefault(n.arg.binds, n)
            elif n.op in (Op.EXTERN, Op.GETITEM) and n.shape is not None:
                call = n.inputs[0] if n.op is Op.GETITEM else n
                for s in sh.free_symbols(n.shape):
                    if sh.is_data_dependent(s) and s not in carried:
                        binders.setdefault(s, call)
        return binders


def _input_symbols(graph: Graph) -> set[sympy.Symbol]:
    """The sizes a graph's inputs carry: in their shapes and strides, or read by ``.item()``."""
    found: set[sympy.Symbol] = set()
    for x in graph.inputs:
        spec = x.arg
        found |= sh.free_symbols([*(x.shape or ()), *(spec.strides or ()),
                                  *([spec.expr] if spec.expr is not None else [])])
        if spec.item is not None:
            found.add(spec.item)
    return found


def _symbols(nodes: set[Node]) -> set[sympy.Symbol]:
    found: set[sympy.Symbol] = set()

    def visit(x: object) -> None:
        if isinstance(x, sympy.Basic):
            found.update(x.free_symbols)
        elif isinstance(x, (tuple, list)):
            for item in x:
                visit(item)

    for n in nodes:
        visit(n.shape or ())
        if n.op is not Op.EXTERN:
            visit(n.arg)
    return found


def _template_symbols(template: object) -> set[sympy.Symbol]:
    """Symbols in an ATen call's argument template (sizes are evaluated when it runs)."""
    if isinstance(template, sympy.Basic):
        return set(template.free_symbols)
    if isinstance(template, (tuple, list)):
        return set().union(*(_template_symbols(t) for t in template)) if template else set()
    if isinstance(template, dict):
        return _template_symbols(list(template.values()))
    return set()
