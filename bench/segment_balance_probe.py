"""Where a ragged segment mean loses bandwidth: hand-written Triton kernels against ember's, one call.

    python bench/segment_balance_probe.py [--docs 256] [--max-len 512] [--width 768] [--reps 200]

The ragged suite's pooling (issue 5: mean of each document's token embeddings, bf16, 256
documents of 1..512 tokens, width 768) reads ~100 MB; ember's kernel takes ~32 µs on an H200,
~75% of the copy bandwidth. A program per (document, column block) loops as long as its
document, so the programs' lengths vary 1..512 rows and the long ones that start late form a
tail. This probe times, with the same inputs and CUDA events over back-to-back launches:

* ``doc-major XBxRB/w``: ember's schedule written by hand (a program per document and block of
  XB columns, RB rows a step, w warps);
* ``longest-first``: the same, its programs ordered by descending document length (a host
  sort: the bound of what ordering could give, not a schedule ember could use as is);
* ``chunks XBxRB/w``: a program per RB rows of the packed tokens (whatever documents they
  hold) and XB columns, adding its per-document sums into a float32 accumulator with atomics,
  then a second kernel dividing, casting and zeroing the accumulator for the next call;
* ``doc-split``: doc-major, but documents longer than a piece split over programs of a piece,
  their partial sums added into a float32 accumulator, the last piece finishing;
* ``read`` (a bound): the same chunk tiles summed into one partial per program, no atomics;
* ember's compiled ``segment_mean`` (profiler kernel time), as its heuristic picks and with its
  rows split over 2 or 4 programs (``triton_launch`` SPLIT), and the copy bandwidth of a clone.

Every variant's result is checked against a float64 reference first. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@triton.jit
def _doc_major(x, off, out, order, D: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr, ORDERED: tl.constexpr):
    pid = tl.program_id(0)
    item = pid // (D // XB)
    cb = pid % (D // XB)
    doc = tl.load(order + item) if ORDERED else item
    start = tl.load(off + doc)
    end = tl.load(off + doc + 1)
    cols = cb * XB + tl.arange(0, XB)
    acc = tl.zeros([RB, XB], tl.float32)
    for r in range(start, end, RB):
        rows = r + tl.arange(0, RB)
        tile = tl.load(x + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rows[:, None] < end, other=0)
        acc += tile.to(tl.float32)
    n = tl.maximum(end - start, 1).to(tl.float32)
    tl.store(out + doc * D + cols, (tl.sum(acc, 0) / n).to(tl.bfloat16))


@triton.jit
def _doc_split(x, off, out, acc_ws, counts, D: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr, CH: tl.constexpr):
    # as _doc_major, but a document longer than CH rows is split over programs of CH rows
    # (grid axis 1); its pieces add into a float32 accumulator and the last one finishes
    item = tl.program_id(0)
    doc = item // (D // XB)
    cb = item % (D // XB)
    start = tl.load(off + doc)
    end = tl.load(off + doc + 1)
    lo = start + tl.program_id(1) * CH
    if lo < end or (tl.program_id(1) == 0):
        hi = tl.minimum(lo + CH, end)
        cols = cb * XB + tl.arange(0, XB)
        acc = tl.zeros([RB, XB], tl.float32)
        for r in range(lo, hi, RB):
            rows = r + tl.arange(0, RB)
            tile = tl.load(x + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rows[:, None] < hi, other=0)
            acc += tile.to(tl.float32)
        part = tl.sum(acc, 0)
        n = tl.maximum(end - start, 1)
        pieces = tl.cdiv(n, CH)
        if pieces == 1:
            tl.store(out + doc * D + cols, (part / n.to(tl.float32)).to(tl.bfloat16))
        else:
            tl.atomic_add(acc_ws + doc * D + cols, part, sem="relaxed")
            tl.debug_barrier()
            done = tl.atomic_add(counts + item, 1, sem="acq_rel")
            if done == pieces - 1:
                total = tl.load(acc_ws + doc * D + cols, volatile=True)
                tl.store(acc_ws + doc * D + cols, tl.zeros([XB], tl.float32))  # ready for the next call
                tl.store(out + doc * D + cols, (total / n.to(tl.float32)).to(tl.bfloat16))
                tl.store(counts + item, 0)


@triton.jit
def _chunks(x, off, acc_out, T, B, D: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
    pid = tl.program_id(0)
    chunk = pid // (D // XB)
    cb = pid % (D // XB)
    r0 = chunk * RB
    rows = r0 + tl.arange(0, RB)
    cols = cb * XB + tl.arange(0, XB)
    tile = tl.load(x + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rows[:, None] < T, other=0).to(tl.float32)
    # the document holding row r0: the last d with off[d] <= r0 (binary search over B + 1 offsets)
    lo = 0
    hi = B
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(off + mid) <= r0:
            lo = mid
        else:
            hi = mid
    doc = lo
    start = tl.load(off + doc)
    stop = tl.minimum(r0 + RB, T)
    while start < stop:
        end = tl.load(off + doc + 1)
        inside = (rows[:, None] >= start) & (rows[:, None] < end)
        part = tl.sum(tl.where(inside, tile, 0.0), 0)
        if end > start:
            tl.atomic_add(acc_out + doc * D + cols, part, sem="relaxed")
        doc += 1
        start = end


@triton.jit
def _finish(acc_in, off, out, D: tl.constexpr, XB: tl.constexpr):
    doc = tl.program_id(0)
    cols = tl.program_id(1) * XB + tl.arange(0, XB)
    n = tl.maximum(tl.load(off + doc + 1) - tl.load(off + doc), 1).to(tl.float32)
    s = tl.load(acc_in + doc * D + cols)
    tl.store(out + doc * D + cols, (s / n).to(tl.bfloat16))
    tl.store(acc_in + doc * D + cols, tl.zeros([XB], tl.float32))  # ready for the next call


@triton.jit
def _read(x, partial, T, D: tl.constexpr, XB: tl.constexpr, RB: tl.constexpr):
    pid = tl.program_id(0)
    chunk = pid // (D // XB)
    cb = pid % (D // XB)
    rows = chunk * RB + tl.arange(0, RB)
    cols = cb * XB + tl.arange(0, XB)
    tile = tl.load(x + rows[:, None].to(tl.int64) * D + cols[None, :], mask=rows[:, None] < T, other=0)
    tl.store(partial + pid * XB + tl.arange(0, XB), tl.sum(tile.to(tl.float32), 0))


def _events(fn, reps: int) -> float:
    """Median µs of a launch, timed over ``reps`` back-to-back launches, five rounds."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=256)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--reps", type=int, default=200)
    a = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, a.max_len + 1, (a.docs,), generator=gen)
    offsets = torch.zeros(a.docs + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    T, D, B = int(offsets[-1]), a.width, a.docs
    x = torch.randn(T, D, generator=gen).to(torch.bfloat16).cuda()
    off = offsets.cuda()
    ref = torch.stack([x[s:e].double().mean(0) for s, e in zip(offsets[:-1].tolist(), offsets[1:].tolist())])
    out = torch.empty(B, D, dtype=torch.bfloat16, device="cuda")
    acc = torch.zeros(B, D, dtype=torch.float32, device="cuda")
    order = torch.argsort(lengths, descending=True).cuda()
    gbytes = x.numel() * 2 / 1e9
    rows: list[tuple[str, float, float]] = []

    def record(name: str, fn, check: bool = True) -> None:
        out.zero_()
        fn()
        torch.cuda.synchronize()
        err = (out.double() - ref).abs().max().item() if check else float("nan")
        us = _events(fn, a.reps)
        rows.append((name, us, err))
        print(f"{name:34s} {us:8.1f} µs  {gbytes / us * 1e3:5.2f} TB/s  max err {err:.2e}", flush=True)

    clone_us = _events(lambda: x.clone(), a.reps)
    print(f"{'copy (clone: read + write)':34s} {clone_us:8.1f} µs  {2 * gbytes / clone_us * 1e3:5.2f} TB/s")
    for xb, rb, w in ((32, 64, 2), (64, 32, 2), (32, 32, 1), (64, 64, 4), (128, 16, 2), (128, 32, 4)):
        grid = (B * (D // xb),)
        record(f"doc-major {xb}x{rb}/{w}", lambda xb=xb, rb=rb, w=w, grid=grid: _doc_major[grid](
            x, off, out, order, D, xb, rb, False, num_warps=w))
        record(f"longest-first {xb}x{rb}/{w}", lambda xb=xb, rb=rb, w=w, grid=grid: _doc_major[grid](
            x, off, out, order, D, xb, rb, True, num_warps=w))
    counts = torch.zeros(B * D, dtype=torch.int32, device="cuda")
    for xb, rb, w, ch in ((32, 64, 2, 64), (32, 64, 2, 128), (32, 64, 2, 256), (64, 32, 2, 128), (32, 32, 1, 128)):
        split_grid = (B * (D // xb), triton.cdiv(a.max_len, ch))
        record(f"doc-split {xb}x{rb}/{w} pieces of {ch}", lambda xb=xb, rb=rb, w=w, ch=ch, g=split_grid: _doc_split[g](
            x, off, out, acc, counts, D, xb, rb, ch, num_warps=w))
    for xb, rb, w in ((32, 64, 2), (64, 64, 4), (128, 32, 4), (64, 128, 4), (128, 64, 8), (256, 32, 4)):
        chunk_grid = (triton.cdiv(T, rb) * (D // xb),)

        def chunked(xb=xb, rb=rb, w=w, grid=chunk_grid):
            _chunks[grid](x, off, acc, T, B, D, xb, rb, num_warps=w)
            _finish[(B, D // 256)](acc, off, out, D, 256, num_warps=2)
        record(f"chunks {xb}x{rb}/{w} (+ finish)", chunked)
        partial = torch.empty(chunk_grid[0] * xb, device="cuda")
        record(f"read {xb}x{rb}/{w} (bound)", lambda xb=xb, rb=rb, w=w, g=chunk_grid, pt=partial: _read[g](
            x, pt, T, D, xb, rb, num_warps=w), check=False)
    import ember
    from ember import ragged
    from ember.ragged import Ragged
    from ember.workloads.timing import profile_cuda_kernels
    r = Ragged(x, off)
    # ember's heuristic, then its split of each row block's rows over programs (SPLIT, forced)
    for name, launch in (("heuristic", None), ("split 2", {"SPLIT": 2}), ("split 4", {"SPLIT": 4}),
                         ("32x64/2 split 4", {"XBLOCK": 32, "RBLOCK": 64, "num_warps": 2, "SPLIT": 4})):
        torch._dynamo.reset()  # (one function compiled with other options)
        compiled = ember.compile(ragged.segment_mean, options={"triton_launch": launch} if launch else None)
        with torch.no_grad():
            got = compiled(r)
            err = (got.double() - ref).abs().max().item()
            n, secs = profile_cuda_kernels(lambda c=compiled: c(r))
            n2, secs2 = profile_cuda_kernels(lambda c=compiled: c(r))
        us = min(secs, secs2) * 1e6
        print(f"{'ember, ' + name:34s} {us:8.1f} µs  {gbytes / us * 1e3:5.2f} TB/s  max err {err:.2e}"
              f"  ({n} kernel(s), profiler)", flush=True)
    print(f"{torch.cuda.get_device_name()}, T={T}, {gbytes * 1e3:.1f} MB read")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
