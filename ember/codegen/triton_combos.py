"""Independent pointwise kernels of different sizes, launched as one Triton kernel.

An optimizer's foreach step over parameters of several sizes plans one pointwise kernel per
size (a kernel has one outer domain): an Adam step over a GPT's parameters was 10 launches, and
the kernels of its small parameters are over before the GPU fills. Kernel steps that neither
read nor write what another writes become one *combo* kernel: program p runs the part whose
blocks hold p, on its own block p - (the blocks of the parts before it), as Inductor's combo
kernels do. Each part is rendered as it would be alone, as a ``@triton.jit`` function the combo
calls (Triton inlines it), so its names stay its own. A part's independent groups of stores run
in lanes (codegen/triton_lanes.py) at any size: a program streams one parameter's tensors.

Only kernels of static sizes take part, and only small ones (``MAX_PART_ELEMENTS``): the grid
is the sum of each part's blocks, which the launcher computes from the sizes in the launch
metadata, and the large kernels' time is bandwidth, which a combo does not make faster. The
wrapper calls the combo as one kernel with the parts' parameters together; its in-place
decisions see every part's loads and stores (schedule/inplace.py asks that a store over an input
be computed from each read of it, so a part never stores over what another part reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, Param, Value
from ..schedule.steps import KernelStep, Schedule
from .triton_lanes import lanes_of

# more parts than this start another combo: a program walks the branch chain to its part, and
# one Triton compile takes every part's body
MAX_PARTS = 16
# parameters of a combo at most (pointers and sizes travel in the launch's 4 KB of arguments)
MAX_PARAMS = 384
# loads and stores of a part's body (of each lane) at most: the combo's launch configuration is
# its largest part's, and every program of it holds the registers of its heaviest body
MAX_PART_ACCESSES = 32
# elements of a part in all its lanes at most. Combos are for kernels whose time is latency,
# not bandwidth: on an H200 a combo of a GPT's four largest update kernels (87M floats in 60
# lanes) took 594 us where the kernels alone took 390 (bench/RESULTS.md, seventy-second session).
MAX_PART_ELEMENTS = 1 << 22


def combinable(kernel: Kernel) -> bool:
    """A pointwise kernel of static, nonzero size up to ``MAX_PART_ELEMENTS`` (in all its lanes),
    read and written along its elements (no 2-D tiles), with no symbolic size: one that can be a
    combo's part."""
    from .triton import kind_of  # (triton.py renders combos through this module)

    if kernel.parts or kernel.dots or kernel.sizes or kernel.device_sizes or kind_of(kernel) != "pointwise":
        return False
    n = sh.static(sh.numel(kernel.outer))
    if n is None or n <= 0:
        return False
    bodies = part_lanes(kernel) or [kernel.values]
    return (n * len(bodies) <= MAX_PART_ELEMENTS
            and max(sum(v.kind in ("load", "store") for v in body) for body in bodies) <= MAX_PART_ACCESSES)


def part_lanes(part: Kernel) -> list[list[Value]] | None:
    """A part's lanes (codegen/triton_lanes.py), at any size: a program streams one lane's
    tensors, not a block of every lane's."""
    return lanes_of(part, min_elements=0)


def combine_kernels(schedule: Schedule, combinable: Callable[[Kernel], bool] = combinable) -> Schedule:
    """The schedule with runs of independent combinable kernel steps (two or more) made one step
    of a combo kernel, in the place of the run's first. A run passes over other kernel steps that
    its later members neither read from nor write into, nor read what they write (an optimizer
    step's large update kernels between its small ones); other steps (ATen calls, views) end it.
    ``combinable``: the backend's test of a part (codegen/cuda_combos.py has the CUDA backend's)."""
    steps: list[Any] = []
    run: list[KernelStep] = []
    passed: list[KernelStep] = []  # kernel steps the run's later members move ahead of
    at = 0  # the run's place in ``steps``
    order = {n: i for i, n in enumerate(schedule.graph.nodes)}

    def flush() -> None:
        if run:
            steps[at] = _combined(run, order) if len(run) >= 2 else run[0]
        run.clear()
        passed.clear()

    for step in schedule.steps:
        # (a kernel of more parameters than a combo takes is passed over, as one not combinable)
        if (isinstance(step, KernelStep) and not step.fills and combinable(step.kernel)
                and len(step.kernel.params) <= MAX_PARAMS):
            if run and (len(run) >= MAX_PARTS or not _independent(run + passed, step)
                        or len(_params([*run, step])) > MAX_PARAMS):
                flush()
            if not run:
                at = len(steps)
                steps.append(None)
            run.append(step)
        elif isinstance(step, KernelStep) and run:
            passed.append(step)
            steps.append(step)
        else:
            flush()
            steps.append(step)
    flush()
    if len(steps) == len(schedule.steps):
        return schedule
    kernels = [s.kernel for s in steps if isinstance(s, KernelStep)]
    return Schedule(schedule.graph, steps, schedule.buffers, kernels, schedule.attempts, schedule.reused)


def _independent(run: list[KernelStep], step: KernelStep) -> bool:
    """Does ``step`` read nothing these steps write, and write nothing they read or write?"""
    written = {p.name for s in run for p in s.kernel.params if p.is_output}
    touched = {p.name for s in run for p in s.kernel.params}
    return all(p.name not in (touched if p.is_output else written) for p in step.kernel.params)


def _params(run: list[KernelStep]) -> list[Param]:
    seen: dict[str, Param] = {}
    for s in run:
        for p in s.kernel.params:
            seen.setdefault(p.name, p)
    return list(seen.values())


def _combined(run: list[KernelStep], order: dict[Any, int]) -> KernelStep:
    parts = [s.kernel for s in run]
    origins: list[str] = []
    for k in parts:
        origins += [o for o in k.origins if o not in origins]
    biggest = max(int(sh.static(sh.numel(k.outer))) for k in parts)
    combo = Kernel(name=f"combo_of_{len(parts)}_{parts[0].name}", params=_params(run), sizes=[],
                   outer=(sympy.Integer(biggest),), inner=(), values=[v for k in parts for v in k.values],
                   origins=origins, parts=parts)
    nodes = sorted({n for s in run for n in s.nodes}, key=lambda n: order.get(n, len(order)))
    return KernelStep(combo, [r for s in run for r in s.roots], nodes)


def blocks(part: Kernel) -> tuple[int, int]:
    """A part's elements and lanes: its programs are its lanes times its blocks of elements."""
    return int(sh.static(sh.numel(part.outer))), len(part_lanes(part) or ()) or 1


def render_combo(kernel: Kernel) -> str:
    """The parts as ``@triton.jit`` functions, then the combo kernel that calls them."""
    from .triton import TritonKernelRenderer

    sources = [TritonKernelRenderer(part).render_part(part_lanes(part)) for part in kernel.parts]
    params = [p.name for p in kernel.params]
    extra = ["OUTER", "INNER", "WORKSPACE", "COUNTER", "BIG: tl.constexpr", "XBLOCK: tl.constexpr",
             "RBLOCK: tl.constexpr", "PERSISTENT: tl.constexpr", "NPROG_BLOCK: tl.constexpr"]
    lines = [f"# {kernel.name}: {len(kernel.parts)} independent pointwise kernels in one launch",
             "# program p runs the kernel whose blocks hold p, on its block p - (the blocks before them)",
             "@triton.jit", f"def {kernel.name}({', '.join(params + extra)}):",
             "    pid = tl.program_id(0)"]
    ends, calls, start = [], [], "0"
    for i, part in enumerate(kernel.parts):
        n, lanes = blocks(part)
        ends.append(f"    end{i} = {'' if start == '0' else start + ' + '}tl.cdiv({n}, XBLOCK)"
                    + (f" * {lanes}" if lanes > 1 else "") + f"  # {part.name}: {n} elements"
                    + (f" in {lanes} lanes" if lanes > 1 else ""))
        calls.append(f"    {'if' if i == 0 else 'elif'} pid < end{i}:")
        args = [p.name for p in part.params] + [f"pid - {start}" if start != "0" else "pid", "BIG", "XBLOCK"]
        calls.append(f"        {part.name}({', '.join(args)})")
        start = f"end{i}"
    lines += ends + calls
    return "\n\n".join([*sources, "\n".join(lines)])


def combo_meta(kernel: Kernel) -> dict[str, Any]:
    """Launch metadata of a combo: a pointwise kernel over its largest part's elements (which
    pick the launch configuration), its grid the sum of every part's programs."""
    return {
        "kind": "pointwise",
        "outer": str(int(sh.static(sh.numel(kernel.outer)))),
        "inner": "1",
        "sizes": [],
        "params": [p.name for p in kernel.params],
        "multi_program": False,
        "split_rows": False,
        "n_reductions": 0,
        "chunks": None,
        "row_reductions": 0,
        "aligned": False,
        "device_sizes": False,
        "lanes": 1,
        "parts": [list(blocks(part)) for part in kernel.parts],
    }
