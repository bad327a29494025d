"""Combo kernels on the CUDA backend: independent small pointwise kernels in one launch.

Which kernels combine, and why, is codegen/triton_combos.py's (``combine_kernels``, with this
module's ``combinable``): an optimizer's foreach step over parameters of several sizes plans a
pointwise kernel per size, most of them too small to fill the GPU. Here each part is its kernel's
body as a device function (codegen/cuda.py, rendered as a part) whose block, block count and lane
are arguments; the combo's block b runs the part whose blocks hold b. A part's blocks are fixed
when it is rendered (its sizes are static): enough for one unrolled step of 16-byte groups a
thread, a row of them per lane. The launch is those blocks of ``POINTWISE_THREADS`` threads.
"""

from __future__ import annotations

from typing import Any

from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel
from .cuda import CUDA, CudaKernelRenderer
from .cuda_plan import lane_plan, pointwise_lanes, strategy, vector_plan
from .cuda_prelude import POINTWISE_THREADS
from .triton_combos import MAX_PART_ACCESSES, MAX_PART_ELEMENTS

# Groups (or elements) a thread of a part takes per iteration: EMBER_COMBO_UNROLL in the source.
# One, not a lone kernel's EMBER_UNROLL of 4: a combo is one function of every part, unrolled
# code multiplies, and on an H200 (a small GPT's Adam step, bench/optimizer_step.py's variants
# ember-cuda-u1/-u2/-u4) one was as fast (combo kernel 50.2 / 50.8 / 51.6 µs) and compiled in
# half the time (nvcc 16.6 / 18.9 / 34.2 s; with powf called, cuda_prelude.py, 6.5 and 31.9).
COMBO_UNROLL = 1


def combinable(kernel: Kernel) -> bool:
    """A pointwise kernel (no tiles through shared memory) of static, nonzero size up to
    ``MAX_PART_ELEMENTS`` in all its lanes, with no symbolic size."""
    if kernel.parts or kernel.dots or kernel.sizes or kernel.device_sizes or strategy(kernel) != "pointwise":
        return False
    n = sh.static(sh.numel(kernel.outer))
    if n is None or n <= 0:
        return False
    bodies = pointwise_lanes(kernel, part=True) or [kernel.values]
    return (n * len(bodies) <= MAX_PART_ELEMENTS
            and max(sum(v.kind in ("load", "store") for v in body) for body in bodies) <= MAX_PART_ACCESSES)


def part_blocks(part: Kernel) -> tuple[int, int]:
    """A part's blocks for each lane, and its lanes."""
    n = int(sh.static(sh.numel(part.outer)))
    lanes = pointwise_lanes(part, part=True)
    plans = [lane_plan(part, values) for values in lanes] if lanes else [vector_plan(part, 0)]
    step = POINTWISE_THREADS * COMBO_UNROLL * max((p.width for p in plans if p is not None), default=1)
    return max(1, -(-n // step)), len(lanes or ()) or 1


def render_combo(kernel: Kernel) -> str:
    """The parts' bodies, then the combo's entry points (32- and 64-bit indices, as every kernel's)."""
    bodies = []
    for part in kernel.parts:
        renderer = CudaKernelRenderer(part, part=True)
        renderer.render_body()
        bodies.append("\n".join(renderer.lines))
    params = ", ".join(f"{'' if p.is_output else 'const '}{CUDA.storage[p.dtype]}* __restrict__ {p.name}"
                       for p in kernel.params)
    lines = [f"// {kernel.name}: {len(kernel.parts)} independent pointwise kernels in one launch "
             "(codegen/cuda_combos.py)",
             "// block b runs the kernel whose blocks hold b, on its block b - (the blocks before them)"]
    for wide, index, suffix in ((False, "uint32_t", ""), (True, "int64_t", "_i64")):
        lines.append("#else" if wide else "#ifndef EMBER_WIDE_INDEX")
        lines.append(f'extern "C" __global__ void __launch_bounds__({POINTWISE_THREADS}) '
                     f"{kernel.name}{suffix}({params}) {{")
        lines.append("  const unsigned b = blockIdx.x;")
        start = 0
        for i, part in enumerate(kernel.parts):
            blocks, lanes = part_blocks(part)
            end = start + blocks * lanes
            n = int(sh.static(sh.numel(part.outer)))
            what = f"{part.name}: {n} elements, {blocks} block(s)" + (f" in each of {lanes} lanes" if lanes > 1 else "")
            lines.append(f"  {'if' if i == 0 else '} else if'} (b < {end}u) {{  // {what}")
            local = f"b - {start}u" if start else "b"
            block, lane = (f"({local}) % {blocks}u", f"({local}) / {blocks}u") if lanes > 1 else (local, "0u")
            args = ", ".join([p.name for p in part.params] + [f"({index})({block})", f"({index}){blocks}", lane])
            lines.append(f"    {part.name}_body<{index}>({args});")
            start = end
        lines += ["  }", "}"]
    lines.append("#endif")
    unroll = f"#define EMBER_COMBO_UNROLL {COMBO_UNROLL}  // a part's elements (or groups) a thread per iteration"
    return unroll + "\n\n" + "\n\n".join(bodies) + "\n" + "\n".join(lines)


def combo_blocks(kernel: Kernel) -> int:
    return sum(blocks * lanes for blocks, lanes in map(part_blocks, kernel.parts))


def combo_meta(kernel: Kernel) -> dict[str, Any]:
    """What the launcher needs (codegen/cuda_plan.py: launch_meta's keys): a 'combo' launch of
    ``outer`` blocks, the parts' blocks together."""
    return {
        "strategy": "combo",
        "outer": str(combo_blocks(kernel)),
        "inner": "1",
        "sizes": [],
        "float_sizes": [],
        "n_params": len(kernel.params),
        "n_reductions": 0,
        "workspace": False,
        "split_columns": False,
        "split_rows": False,
        "row_reductions": 0,
        "chunks": None,
        "row_groups": False,
        "max_threads": POINTWISE_THREADS,
        "vector": 1,
        "lanes": 1,
        "kernels": {"i32": kernel.name, "i64": f"{kernel.name}_i64"},
        "parts": [list(part_blocks(part)) for part in kernel.parts],
    }
