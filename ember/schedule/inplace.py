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
* or a row kernel stores ``dst`` once per row, outside its loops (a BatchNorm's new running
  variance, from the old one and the batch's), and what it reads of ``src`` feeds that store
  alone: nothing in the loops, no other output. Every backend stores a row's outer results from
  one thread (CUDA C++: thread 0 of the row's threads; Triton: one of the threads holding the
  value; C++ column tiles split into runs: the thread that combines them), from values that
  thread computed itself, after its own read of ``src``. Other threads may read ``src`` after
  that store (a Triton warp running behind, a run of the C++ column kernel's later loop redoing
  the row's stages), but what they read goes nowhere;
* no matmul tiles, ragged segments, chunked column sums, reductions over all rows, writes at
  indices or accumulating stores, whose programs read elements they do not own.

This is the rule Inductor applies before it reuses a buffer in place.
"""

from __future__ import annotations

import sympy

from .kernel_ir import Kernel, Value, reachable


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
    reads = [v for v in kernel.values if v.kind in ("load", "search") and v.arg.buffer == src]
    if not reads or any(v.kind != "load" for v in reads):
        return False
    if kernel.n_loops:
        last = max((v.loop for v in kernel.values if v.kind in ("reduce", "store")), default=0)
        if store.inner and store.loop != last:
            return False
        if not store.inner and not _feeds_only(kernel, reads, store):
            return False
    before = reachable([*store.srcs, *([store.guard] if store.guard is not None else [])])
    index = sympy.sympify(store.arg.index)
    return all(not r.arg.bindings and r.inner == store.inner and id(r) in before
               and sympy.simplify(sympy.sympify(r.arg.index) - index) == 0 for r in reads)


def _feeds_only(kernel: Kernel, reads: list[Value], store: Value) -> bool:
    """Does everything computed from ``reads`` stay outside the kernel's loops and reach no
    store but ``store``?"""
    tainted = {id(r) for r in reads}
    for v in kernel.values:  # (in program order: a value's sources come before it)
        read = (*v.srcs, *([v.guard] if v.guard is not None else []))
        if id(v) in tainted or not any(id(s) in tainted for s in read):
            continue
        if v.inner or v.kind not in ("alu", "store") or (v.kind == "store" and v is not store):
            return False
        tainted.add(id(v))
    return True
