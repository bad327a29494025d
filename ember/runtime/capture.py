"""Which sizes a compiled program takes from the host, and the check ``ember.cuda_graph`` runs.

A CUDA graph replays its kernels with the arguments they were captured with. ``ember.cuda_graph``
captures a step once per *capacity* C of each ragged input, with buffers of C rows, and replays
it for every batch of at most C rows: that is right only where nothing depends on the host's
value of the total length T (which is C in the graph), i.e. where every kernel reads T from the
offsets on the device (schedule/device_sizes.py). This module finds, for each program, the sizes
that something still takes from the host (``host_sizes``), and records them while a check is on
(``check_programs``), so the capture can refuse a capacity that one of them equals.

What takes a size from the host: a kernel that does not read it on the device (a matmul tile, a
size that is no ragged total), an ATen call over a tensor of that size, a kernel group that runs
through ATen, a view whose offset depends on it, and the strides of the program's inputs and
outputs (kernels would address them with the device's T).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import sympy

from ..ir import shapes as sh
from ..ir.node import Graph, ragged_totals
from ..ir.ops import Op
from ..schedule.device_sizes import DEVICE_TOTALS
from ..schedule.steps import ExternStep, KernelStep, Schedule, ViewStep


def host_symbols(graph: Graph, schedule: Schedule, failed: set[str]) -> set[sympy.Symbol]:
    """The size symbols whose host value a result of the program depends on; ``failed`` names
    the kernels that run through ATen."""
    used: set[sympy.Symbol] = set()
    for step in schedule.steps:
        if isinstance(step, KernelStep):
            k = step.kernel
            used |= set(k.sizes) if k.name in failed else set(k.sizes) - set(k.device_sizes)
        elif isinstance(step, ExternStep):
            for node in (step.node, *step.node.inputs):
                used |= sh.free_symbols(node.shape or ())
        elif isinstance(step, ViewStep) and step.node.op is Op.SLICE:
            used |= sh.free_symbols(step.node.arg[1:3])  # the start (an offset into the base) and step
    for node in graph.inputs:
        if node.arg.kind == "tensor":
            used |= sh.free_symbols(node.arg.strides or ())
    for i, out in enumerate(graph.outputs):
        if out is not None and i not in graph.scalar_outputs and i < len(graph.output_strides):
            used |= sh.free_symbols(graph.output_strides[i] or ())
    # a batch size B (the length B + 1 of a ragged total's offsets) is no total: cuda_graph
    # copies offsets at their exact length and captures again for another B
    totals = ragged_totals(graph)
    batch_sizes = sh.free_symbols([d for offsets in totals.values() for d in offsets.shape]) - set(totals)
    return used - batch_sizes - {DEVICE_TOTALS}  # (the switch, not a size)


def host_size_inputs(graph: Graph, used: set[sympy.Symbol]) -> tuple[dict[int, str], bool]:
    """(input index -> symbol name, for the size inputs carrying a host-used symbol; whether some
    host-used symbol is carried by no size input, so its value cannot be checked)."""
    carried: dict[int, str] = {}
    for node in graph.inputs:
        spec = node.arg
        if spec.kind == "symint" and isinstance(spec.expr, sympy.Symbol) and spec.expr in used:
            carried[spec.index] = spec.expr.name
    unseen = {s.name for s in used} - set(carried.values())
    return carried, bool(unseen)


@dataclass
class ProgramRun:
    program: str
    host_sizes: dict[str, int]   # symbol -> its value in this call
    opaque: bool                 # some host-used size could not be read


@dataclass
class ProgramCheck:
    runs: list[ProgramRun] = field(default_factory=list)


active: list[ProgramCheck] = []
# how many ember.cuda_graph steps are running (warm-up, check and capture): kernels read their
# ragged totals on the device only then (schedule/device_sizes.py)
_graphed_steps = [0]


def in_graphed_step() -> int:
    """The ``device_totals`` size host programs pass to kernels that can read a total on the device."""
    return 1 if _graphed_steps[0] else 0


@contextlib.contextmanager
def totals_on_device() -> Iterator[None]:
    """Kernels inside read their ragged totals from the offsets: the step's buffers hold a
    capacity's rows, of which the offsets' last element says how many are the batch's."""
    _graphed_steps[0] += 1
    try:
        yield
    finally:
        _graphed_steps[0] -= 1


RANGE_PREFIX = "ember program "  # the profiler range a program runs in while a check is on


def record(program: str, args: list[object], host_sizes: dict[int, str], opaque: bool) -> None:
    values = {name: int(args[i]) for i, name in host_sizes.items() if isinstance(args[i], int)}
    for check in active:
        check.runs.append(ProgramRun(program, values, opaque))


@contextlib.contextmanager
def check_programs() -> Iterator[ProgramCheck]:
    """Record every compiled program that runs inside, with its host-used sizes' values."""
    check = ProgramCheck()
    active.append(check)
    try:
        yield check
    finally:
        active.remove(check)
