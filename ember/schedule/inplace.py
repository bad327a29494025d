"""May a kernel write an output over one of its inputs? (The host program then reuses the memory
of a buffer that dies in that kernel instead of allocating a new one.)

Writing ``dst`` over ``src`` is safe when every element of ``src`` is read, by the program that
owns it, before that program writes the same element of ``dst``, and read nowhere else:

* every read of ``src`` is at the very index ``dst`` is stored at (no gather, no shifted or
  transposed read), so element i of ``dst`` overwrites only element i of ``src``;
* the value stored depends on every read of ``src``: each read comes before the store in program
  order, and a backend that moves the value between threads (a Triton layout change) does it
  after the read;
* a row kernel stores ``dst`` inside its last loop over the row, so the earlier loops (a softmax's
  max and sum) have read the whole row; a row split over programs (``codegen/triton_loops.py:
  split_rows``) stores inside a loop only in one-pass kernels, where each slice's program reads
  and writes its own elements;
* no matmul tiles, ragged segments, chunked column sums, reductions over all rows, writes at
  indices or accumulating stores, whose programs read elements they do not own.

This is the rule Inductor applies before it reuses a buffer in place.
"""

from __future__ import annotations

import sympy

from .kernel_ir import Kernel, reachable


def writes_in_place(kernel: Kernel, src: str, dst: str) -> bool:
    """Can ``kernel`` store its output ``dst`` over its input ``src`` (same size and layout)?"""
    if kernel.dots or kernel.chunks or kernel.segment_length is not None or kernel.row_reductions:
        return False
    stores = [v for v in kernel.values if v.kind == "store" and v.arg.buffer == dst]
    if len(stores) != 1 or any(v.kind == "store" and v.arg.buffer == src for v in kernel.values):
        return False
    store = stores[0]
    if store.arg.bindings or store.arg.accumulate:
        return False
    if kernel.n_loops:
        last = max((v.loop for v in kernel.values if v.kind in ("reduce", "store")), default=0)
        if not store.inner or store.loop != last:
            return False
    reads = [v for v in kernel.values if v.kind in ("load", "search") and v.arg.buffer == src]
    if not reads or any(v.kind != "load" for v in reads):
        return False
    before = reachable([*store.srcs, *([store.guard] if store.guard is not None else [])])
    index = sympy.sympify(store.arg.index)
    return all(not r.arg.bindings and r.inner == store.inner and id(r) in before
               and sympy.simplify(sympy.sympify(r.arg.index) - index) == 0 for r in reads)
