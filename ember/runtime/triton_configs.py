"""Launch configurations for ember's Triton kernels: picked from the shape, or tuned exhaustively.

A configuration is ``dict(XBLOCK, RBLOCK, num_warps, PERSISTENT, num_stages[, SPLIT])``. Compiling one costs
~100-200 ms of Triton and ptxas time, so by default (``triton_tuning="heuristic"``) a kernel gets
one configuration per shape bucket, chosen from what it reads (``KernelHints``), the shape and the
GPU's SM count, with no timing runs -- except pointwise kernels of ``TIMED_POINTWISE`` elements or
more, whose best vector width differs between GPUs: their three ``pointwise_choices`` are timed
once and the fastest remembered on disk. ``triton_tuning="full"`` compiles and times every
candidate of ``exhaustive`` (15-25 for a row kernel) and remembers the fastest.

The heuristic follows what full tuning chose on an H200 (bench/RESULTS.md): pointwise kernels
move 16 bytes per thread and load; rows up to 16384 wide stay whole in registers (one pass over
memory): rows of a hidden size (512-2048) in programs of one or two warps and 1024-2048 elements,
other narrow rows packed into tiles of 4096 elements, 16 per thread; wider rows that are only
reduced loop over 1024-wide chunks with one warp per row (shuffle-only reductions, pipelined
loads), wider rows that are also written take 4 rows per program; column sums take 16 columns
per program so each row's read fills whole 32-byte sectors (up to 128 when there are columns
to spare), and few long column sums (a weight gradient) 64 columns per program with each
column's rows split over programs (``SPLIT``) until every SM has about four. Compile time grows
with the elements each thread holds, so among equally fast choices the heuristic takes fewer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import sympy

from ..codegen.online_softmax import online_softmax_pairs
from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel, indirect_var, inner_var, is_indirect_var, outer_var

MAX_PERSISTENT = 32768    # widest row any candidate keeps whole in registers (elements)
TIMED_POINTWISE = 1 << 23  # pointwise kernels this large time ``pointwise_choices`` once per bucket
HEURISTIC_PERSISTENT = 16384  # widest row the heuristic keeps whole (wider rows looped faster)
DEFAULT_SMS = 132         # H100/H200, for interpreter runs and machines without CUDA
FULL_PROGRAMS = 16        # programs a short full reduction spreads over (its elements are latency)

Config = dict[str, Any]


@dataclass(frozen=True)
class KernelHints:
    """What a kernel's accesses say about its best launch, read from its kernel IR."""

    itemsize: int = 4                 # narrowest element the kernel streams (bytes)
    columns: bool = False             # the reduced dim is strided in memory (a column sum)
    writes_rows: bool = False         # stores inside its inner loops (writes whole rows)
    reads_rows: bool = True           # loads inside its inner loops (False: it only writes them)
    reduces: bool = True              # reductions in its inner loops (False: it only maps its rows)
    accumulates: bool = False         # adds into an output: one run per call, never timed
    splittable: bool = False          # its rows may split over programs (codegen's split_rows; a
    #                                   full reduction's: partials from many programs)
    segments: bool = False            # its rows are a ragged tensor's (lengths read from offsets)
    over_rows: bool = False           # reduces over all rows too (a loss's mean): programs combine
    online: bool = False              # a softmax's max and sum in one loop (codegen/online_softmax.py)
    scattered: bool = False           # pointwise, and no access contiguous along any of its dims
    scans: bool = False               # a scan kernel (codegen/triton_scan.py): its rows walked in chunks
    chunks: bool = False              # its programs walk runs of rows, adding them into column
    #                                   partials (a norm's backward with its weight's gradient)


def hints_of(kernel: Kernel) -> KernelHints:
    """Hints from the loads and stores of ``kernel`` (a combo's: its largest part's, whose
    elements pick its launch configuration); any surprise gives the defaults."""
    if kernel.parts:
        kernel = max(kernel.parts, key=lambda k: int(sh.static(sh.numel(k.outer)) or 0))
    try:
        return _hints_of(kernel)
    except Exception:  # noqa: BLE001 -- a hint is an optimization, never a reason to fail
        return KernelHints()


def _hints_of(kernel: Kernel) -> KernelHints:
    last = inner_var(len(kernel.inner) - 1) if kernel.inner else None
    outers = [outer_var(i) for i in range(len(kernel.outer))]
    sizes, contiguous, strided, dense = [], 0, 0, False
    for v in kernel.values:
        if v.kind not in ("load", "store"):
            continue
        index = sympy.sympify(v.arg.index)
        # gathers and scatters: their layout says nothing about the tile; but a segment kernel
        # reads its rows from a loaded start (its first indirect variable) + r0
        row_start = kernel.segment_length is not None and v.arg.bindings == (indirect_var(0),)
        names = {s.name for s in index.free_symbols}
        if any(is_indirect_var(s) for s in index.free_symbols) and not row_start:
            # a gather inside the loop at indices read down it (an embedding bag's rows), whose
            # elements are adjacent along the last outer dim: a column access
            if (v.kind == "load" and v.inner and last is not None and last.name not in names
                    and outers and sympy.diff(index, outers[-1]) == 1):
                strided += 1
                sizes.append(v.dtype.itemsize)
            continue
        varying = any(n[0] == "o" and n[1:].isdigit() for n in names)
        dense = dense or any(sympy.diff(index, o) == 1 for o in outers if o.name in names)
        if v.inner and last is not None and (v.kind == "load" or kernel.segment_length is not None):
            # loads the same for every outer index (a norm's weight, the row statistics a column
            # sum reads) say nothing about the layout of the tile; a segment kernel's stores down
            # its rows (a mean's gradient) do
            step = sympy.diff(index, last)
            if varying and step == 1:
                contiguous += 1
            elif varying and step != 0:
                strided += 1
        if varying or v.inner:
            sizes.append(v.dtype.itemsize)
    stores = [v for v in kernel.values if v.kind == "store"]
    return KernelHints(itemsize=min(sizes, default=4), columns=strided > contiguous,
                       writes_rows=any(v.inner for v in stores),
                       reads_rows=any(v.inner for v in kernel.values if v.kind == "load"),
                       accumulates=any(getattr(v.arg, "accumulate", False) for v in stores),
                       reduces=bool(kernel.reductions), segments=kernel.segment_length is not None,
                       over_rows=bool(kernel.row_reductions), online=bool(online_softmax_pairs(kernel)),
                       scattered=not kernel.inner and not dense, scans=bool(kernel.scans),
                       chunks=bool(kernel.chunks))


@functools.cache
def sm_count(device_index: int | None) -> int:
    try:
        import torch
        if torch.cuda.is_available():
            index = torch.cuda.current_device() if device_index is None else device_index
            return int(torch.cuda.get_device_properties(index).multi_processor_count)
    except Exception:  # noqa: BLE001 -- no driver: the default is as good as any
        pass
    return DEFAULT_SMS


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _prev_pow2(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)


def _config(x: int, r: int, warps: int, persistent: bool = False, stages: int = 1, split: int = 1) -> Config:
    c = dict(XBLOCK=x, RBLOCK=r, num_warps=warps, PERSISTENT=persistent, num_stages=stages)
    if split > 1:
        c["SPLIT"] = split
    return c


def fitted_warps(config: Config) -> int:
    """The configuration's warps, at most one per 32 elements of its tile. A tile of fewer
    elements than threads repeats each element over warps; in a kernel that writes an output
    over an input it reads (schedule/inplace.py), one warp's store can land before another
    warp's load of the same element, which then reads the new value. (A bias gradient's 8 x 3
    column sum, written over a saved value, ran in 8 warps on an H100 and every sum was wrong,
    run after run; in one warp it is right.) Within one warp the load comes before the store
    for every lane, so a tile of fewer than 32 elements takes one warp."""
    tile = config["XBLOCK"] * config["RBLOCK"]
    return max(1, min(config["num_warps"], tile // 32))


def _split(outer: int, xblock: int, inner: int, rblock: int, hints: KernelHints, sms: int,
           per_sm: int = 4, most: int = 64) -> int:
    """Programs per row block: with fewer row blocks than two per SM, each row's reduction is
    split over programs until every SM has about ``per_sm``, each slice at least four blocks
    long, at most ``most`` slices."""
    blocks = -(-outer // xblock)
    if not hints.splittable or blocks >= 2 * sms:
        return 1
    split = min(next_pow2(-(-per_sm * sms // max(blocks, 1))), most)
    while split > 1 and inner < split * 4 * rblock:
        split //= 2
    return split


def heuristic(kind: str, outer: int, inner: int, hints: KernelHints, sms: int = DEFAULT_SMS) -> list[Config]:
    """The configuration for this shape first, then safer ones to fall back on if it does not
    compile (too many registers, too much shared memory). Only the first normally compiles."""
    # elements per thread so that each thread moves 16 bytes per load (4 fp32, 8 bf16)
    per_thread = 16 // min(max(hints.itemsize, 2), 4)
    if kind == "pointwise" and hints.scattered:
        # gathers and strided stores only (the GIoU study's ragged gradient, a 4-coordinate
        # box stored per place, its inputs gathered at each box): no access to widen to 16
        # bytes, so 4 elements a thread in one-warp programs, for more of them in flight and
        # fewer registers (H200, 1024 x 256 places: 5.9 us in 1024-element 4-warp programs,
        # 4.5 in 128-element 1-warp ones; bench/launch_sweep.py --case giou_ragged --train)
        return [_config(128, 1, 1), _config(1024, 1, 4)]
    if kind == "pointwise":
        xblock = min(128 * per_thread, max(64, next_pow2(outer)))
        warps = max(1, min(4, xblock // (32 * per_thread)))
        return [_config(xblock, 1, warps), _config(1024, 1, 4)]
    if kind == "tiles":
        # a transposed pointwise kernel: 64 x 64 tiles, 8 warps (H100, bf16, us: an 8192 x 8192
        # transpose 100.4, Inductor 108.9; a (64, 1024, 1000) permute 115.1 against 123.0; a
        # batched x.mT + y over 64 x 512 x 512, 41.2 against 39.0). Of 7 tiles swept
        # (bench/launch_sweep.py TRANSPOSES) none was best in all three; this one had the least
        # total time (16 x 128 took the permute to 102.9, 128 x 64 the transpose to 98.1)
        return [_config(min(64, next_pow2(outer)), min(64, next_pow2(inner)), 8), _config(16, 16, 1)]
    if kind == "full":
        # many programs write partials, the last combines them; 8 elements per thread (more
        # unroll more code: 16 per thread compile ~1.5x longer). A short reduction (under 32768
        # elements) still spreads over FULL_PROGRAMS programs, 2-8 elements a thread: its time
        # is latency, not bandwidth. The GIoU study's ragged loss over 2000 boxes, each searching
        # the offsets and gathering its prediction, in its training step (H200, bench/giou_step.py,
        # the same call): 8.0-8.5 us in one 8-warp program of 2048, 4.6-4.9 in 16 programs. 16,
        # not 8: in a CUDA graph the grid is sized for the capacity, up to twice the boxes, and
        # programs past the boxes idle. (bench/launch_sweep.py --case giou_ragged times that
        # kernel at 4.3-4.5 us in one program and in 16 alike: the one-program cost shows only
        # in the step, for reasons not found.)
        spread = FULL_PROGRAMS if hints.splittable else 1  # (one program loops over all of it)
        rblock = min(2048, max(128, next_pow2(-(-inner // spread))))
        warps = max(1, min(8, rblock // 64)) if spread > 1 else max(1, rblock // 256)
        return [_config(1, rblock, warps), _config(1, 1024, 4)]
    safe = _config(1, min(1024, max(16, next_pow2(inner))), 4)
    rows = next_pow2(outer)
    if hints.columns and hints.splittable and -(-outer // 64) < 2 * sms:
        # few columns, long sums (a weight's gradient, 4096 columns over 16384 rows): tiles of 64
        # columns x 64 rows, each column's rows split over programs (H200: LayerNorm's weight and
        # bias gradients 208 -> 120 us, RMSNorm's 120 -> 90 us). Not in 2 or 4 slices: their
        # partials' trip through the workspace and a count cost more than the slices gain. The
        # column sums finishing a norm's backward over 528 and 1056 runs of rows took 26.7 and
        # 31.8 us (LayerNorm's two) and 7.8 and 19.8 (RMSNorm's one) that way, 8.1, 15.2, 4.1
        # and 7.4 in the 16-column tiles below (H200, bench/chunk_sweep.py, 16384 x 4096)
        # Up to 256 slices: a BatchNorm's statistics over a channels_last (64, 112, 112, 64)
        # activation are one tile of columns, 800K rows long (64 slices left 64 of 132 SMs busy)
        split = _split(outer, 64, inner, 64, hints, sms, most=256)
        if split > 4:
            return [_config(min(64, rows), 64, 4, stages=2, split=split), safe]
    if hints.columns:
        # 16 adjacent columns per program: each row of the tile is 32+ contiguous bytes; with
        # columns to spare (pooling 256 documents x 768 features), up to 128, so that each row
        # of the tile is one long contiguous read, while every SM keeps 4+ programs
        xblock = 16
        while xblock < 128 and outer // (2 * xblock) >= 4 * sms:
            xblock *= 2
        xblock = min(xblock, rows)
        if hints.segments:
            # ragged rows (a segment sum loops as long as its longest row in the tile): tiles of
            # 2048 elements, at most 32 columns by 64 rows, in 2 warps: 64 bytes of each thread's
            # loads in flight at once (H200, segment means of 1..512 rows of widths 768 / 64 / 4096,
            # kernel us: 38.5 / 36.4 / 146.0 in the 128 x 16 tiles of 4 warps and 3 stages they had,
            # 32.6 / 23.4 / 142.5 in these; those had taken them from 44 / 40 / 211 in tiles of 8192
            # and 8 warps; bench/launch_sweep.py --case segment_mean_pool*).
            #
            # With blocks to spare they do not split their rows: a split only adds programs that
            # wait on each other's partials (pooling 256 x 768: 34 us, 51 with 4 slices, 165 with
            # 16). Nor do they need to: on an H100 pooling's kernel (39.3 us) reads as fast as a
            # plain read of the same tiles with no documents to balance (39.2; ordering programs
            # longest first, splitting long documents into pieces, or packed-token chunks with
            # atomics were all slower: bench/segment_balance_probe.py). A handful of long
            # documents took the split tiles above (4 x 768 features of up to 32768 rows: 586 ->
            # 45 us, --case segment_mean_long).
            #
            # A kernel that only stores down its rows (a mean's gradient) has no loads to keep in
            # flight: 2 warps, 1 stage (pooling's backward: 26.4 us; 28.4 with 4 warps; 37.6 in
            # the 16 x 256 tiles it had while its stores did not count as columns)
            if hints.writes_rows and not hints.reads_rows:
                rblock = min(next_pow2(inner), max(16, 2048 // xblock))
                return [_config(xblock, rblock, 2, stages=1), safe]
            xblock = min(xblock, 32)
            return [_config(xblock, min(next_pow2(inner), 2048 // xblock), 2), safe]
        rblock = min(next_pow2(inner), max(16, 8192 // xblock), 4096)
        return [_config(xblock, rblock, 8, stages=2), safe]
    width = next_pow2(max(inner, 1))
    if hints.over_rows and width <= 2048:
        # narrow rows and then a reduction over all rows (a cross-entropy's mean over 10 to 1000
        # classes): 2-warp programs of 2048 elements. The tiles below, 4-8 warps, took 2-4x as
        # long (H100, kernel us: CE 1M x 10 fp32 116 -> 32, 256K x 100 fp32 199 -> 58, 64K x
        # 1000 bf16 384 -> 89; bench/launch_sweep.py --case ce_100 etc.), for reasons not found
        xblock = _fill(outer, max(1, min(2048 // width, rows)), sms)
        return [_config(xblock, width, 2, persistent=True), safe]
    if hints.scans and 1024 < width and (width <= HEURISTIC_PERSISTENT or outer >= 4 * sms):
        # a scan over rows of a hidden size: a row per program in chunks of 1024 elements (2048
        # of 16 bits), 4 warps. Each chunk's tl.associative_scan crosses the warps through shared
        # memory, which a whole row in 8 warps did at a larger cost (H200, 4096-wide rows, kernel
        # us: cumsum bf16 77.0 -> 64.8, logcumsumexp fp32 239.7 -> 184.3, cumprod fp32 42.1 ->
        # 36.0, cumsum fp32 128.7 -> 131.2, at copy speed either way; bench/scan_sweep.sh). So
        # do rows as wide as a vocabulary, where they are enough to fill the SMs (bf16 x 32000,
        # 1024 rows 40.2 -> 36.9, 4096 rows 153.5 -> 139.4, a softmax's cumsum over 1024 rows
        # 68.1 -> 45.9); fewer long rows keep 8192-wide chunks (64 rows 5.3 against 10.0)
        return [_config(1, 2048 if hints.itemsize <= 2 else 1024, 4), safe]
    if 512 <= width <= 2048 and not hints.chunks:
        # rows of a hidden size (BERT's, GPT-2's): programs of 1024-2048 padded elements, one or
        # two warps, the row in registers. The 4096-element tiles below, 4-8 warps, took up to
        # 1.3x as long (H200, bf16 unless said, 64-128 MB a case, kernel us, tile -> these:
        # LayerNorm 512 wide 80.9 -> 63.4, 768 55.3 -> 48.6, 1024 83.7 -> 63.8, 1536 72.2 ->
        # 65.3, 2048 65.4 -> 63.6; softmax 768 72.1 -> 63.9, 1024 65.9 -> 62.6, 1024 fp32 66.6 ->
        # 62.7; RMSNorm 1024 66.4 -> 63.6; Inductor's LayerNorm 1024: 64.1; bench/launch_sweep.py
        # SHORT_ROWS and ODD_WIDTHS). One-row programs of 512 and two-row ones of 1024 did worse.
        # Not chunked kernels: a program's one or two warps then also hold the run's column
        # partials (GPT-2's LayerNorm backward with its weight gradient, 768 wide: 115 -> 271 us)
        xblock = _fill(outer, max(1, min(1024 // width, rows)), sms)
        warps = max(1, min(2, xblock * inner // 512))
        return [_config(xblock, width, warps, persistent=True), safe]
    if width <= HEURISTIC_PERSISTENT:
        # narrow rows share a program: tiles of 4096 elements, 16 per thread (at 4096 wide,
        # one row and 8 warps was fastest or within 1% for every norm, softmax and backward;
        # 32 per thread compile ~1.6x longer)
        #
        # Warps count the row's real elements, not its padding to a power of two: rows of 5120
        # padded to 8192 took 16 warps, 10 real elements a thread (H100, bf16, kernel us: LayerNorm
        # 110.3 -> 93.8 with 8 warps, softmax 95.1 -> 89.4; 1536 wide, 2 rows: 93.9 -> 90.8 with 4;
        # bench/launch_sweep.py ODD_WIDTHS)
        xblock = _fill(outer, max(1, min(4096 // width, rows)), sms)
        warps = max(4, min(32, _prev_pow2(max(1, xblock * inner // 512))))
        return [_config(xblock, width, warps, persistent=True), safe]
    if hints.writes_rows and not hints.reduces:
        # wide rows read once and written, nothing reduced (CE's gradient from its saved row
        # statistics): a row per program, 8192-wide chunks, 8 warps (8192 x 32000 bf16: H200
        # 268.7 us, H100 354.7, against 290.0 / 376.2 in the tiles below; 4096 x 4 warps took
        # 266.4 / 367.4, one warp per row 275.2 / 378.0: bench/launch_sweep.py)
        return [_config(1, min(width, 8192), 8, stages=2), safe]
    if hints.writes_rows and outer < 4 * sms:
        # a few wide rows read twice and written (a softmax over a vocabulary at small batch):
        # a row per program in 8192-wide chunks, 16 warps; each chunk costs the online max and
        # sum a barrier, so fewer, wider chunks (H100, bf16 softmax, kernel us, against the
        # tiles below: 8 x 128256 194.4 -> 27.0, 64 x 128256 206.4 -> 27.4, 256 x 32000 53.9 ->
        # 12.0; bench/launch_sweep.py --case softmax_vocab_8)
        return [_config(1, min(width, 8192), 16, stages=2), safe]
    if hints.writes_rows and hints.online:
        # a softmax over many wide rows: its max and sum in one loop, then its store loop; a row
        # per program in 8192-wide chunks, 16 warps, as for few rows above (H100, bf16, kernel
        # us: 2048 x 50257 427 -> 257, Inductor 312; 8192 x 32000 570 -> 468, Inductor 579;
        # 4096-wide chunks and 8 warps 279 and 529; bench/launch_sweep.py --case softmax_50257)
        return [_config(1, min(width, 8192), 16), safe]
    if hints.writes_rows:
        # wide rows read twice and written (a log-softmax backward): 4 rows per program in
        # 512-wide chunks, 8 warps (300 us against 357 for one warp per row, 8192 x 32000 bf16)
        return [_config(_fill(outer, min(4, rows), sms), min(width, 512), 8, stages=2), safe]
    # few long rows (sums of 8 x 4M): each row split over 4-warp programs, about 8 per SM, in
    # 4096-wide chunks with 3 stages of loads in flight (H200, bf16 8 x 4M 36 -> 19 us, fp32
    # 4 x 16M maxima 84 -> 78 us, bf16 64 x 1M 41 -> 38 us: bench/launch_sweep.py LONG_ROWS)
    split = _split(outer, 1, inner, min(width, 4096), hints, sms, per_sm=8, most=512)
    if split > 1 and outer * split >= 2 * sms:
        return [_config(1, min(width, 4096), 4, stages=3, split=split), safe]
    # a few wide rows only reduced (a cross-entropy over a 128256-token vocabulary at small
    # batch): each row's slices on one-warp programs, about 16 per SM. Per 512-wide chunk the
    # online softmax reduces across the warp with shuffles alone, where 16-warp programs wait at
    # barriers (H100, 8 x 128256 bf16: 38.7 us in one 16-warp program per row, 22.9 split in
    # 4, 6.8 in 1-warp programs split in 64; 64 rows: 39.8 -> 11.2 us, bench/launch_sweep.py)
    split = _split(outer, 1, inner, 512, hints, sms, per_sm=16, most=64)
    if split > 1:
        return [_config(1, 512, 1, stages=3, split=split), safe]
    # wide rows only reduced (a cross-entropy's statistics): warps per row so that about 16
    # warps per SM are busy; one-warp programs reduce with shuffles alone (no barriers) and
    # pipeline their loads. With 2 to 8 rows an SM (fewer are split below), twice the warps and
    # 16 elements a thread: 16 warps an SM had too few loads in flight (H200, logsumexp over
    # 32000 bf16, kernel us: 512 rows 21.8 -> 11.5, 1024 rows 33.7 -> 24.0; 2048-8192 rows as
    # they were: the same or slower with more warps; bench/launch_sweep.py --case lse_vocab_1024)
    warps = max(1, min(16, _prev_pow2(max(1, sms * 16 // max(outer, 1)))))
    rblock = min(width, max(1024, warps * 256))
    if 2 * sms <= outer <= 8 * sms:
        warps = min(16, warps * 2)
        rblock = min(width, max(1024, warps * 512))
    stages = 3 if warps <= 4 else 1
    split = _split(outer, 1, inner, rblock, hints, sms)  # rows too short for the above
    return [_config(1, rblock, warps, stages=stages, split=split), safe]


def _fill(outer: int, xblock: int, sms: int) -> int:
    """Fewer rows per program while that leaves fewer than two programs per SM."""
    while xblock > 1 and -(-outer // xblock) < 2 * sms:
        xblock //= 2
    return xblock


def exhaustive(kind: str, outer: int, inner: int) -> list[Config]:
    """Every candidate ``triton_tuning="full"`` compiles and times."""
    if kind == "pointwise":
        return [_config(b, 1, w) for b, w in ((1024, 4), (2048, 8), (4096, 8), (512, 4))]
    if kind == "full":
        return [_config(1, b, w) for b, w in ((2048, 8), (1024, 4), (4096, 8), (512, 4))]
    if kind == "tiles":
        return [_config(x, r, w) for x, r, w in ((32, 64, 4), (64, 64, 4), (64, 64, 8), (32, 32, 4), (16, 128, 4),
                                                 (64, 32, 4))]
    out = []
    if inner <= MAX_PERSISTENT:
        rblock = next_pow2(max(inner, 1))
        for x in (1, 2, 4, 8, 16, 32, 64):
            tile = x * rblock
            if tile > MAX_PERSISTENT or x > next_pow2(outer):
                continue
            warps = 4 if tile <= 2048 else 8 if tile <= 8192 else 16 if tile <= 16384 else 32
            out.append(_config(x, rblock, warps, persistent=True))
            if warps < 32 and tile >= 4096:
                out.append(_config(x, rblock, warps * 2, persistent=True))
    # column reductions (the reduced dim is not the contiguous one, e.g. a bias gradient):
    # several columns per program so each row's loads fill whole 32-byte sectors, and enough
    # programs left to fill the GPU
    for x, rblock, warps in ((16, 256, 4), (16, 512, 8), (32, 256, 8), (64, 64, 4), (128, 32, 8)):
        if outer >= x:
            out.append(_config(x, rblock, warps, stages=2))
            for split in (4, 16):  # (tried only by kernels whose rows may split)
                if inner >= split * 4 * rblock:
                    out.append(_config(x, rblock, warps, stages=2, split=split))
    # one-warp programs reduce with shuffles only, no barriers: long rows are latency-bound
    for x, rblock, warps, stages in ((1, 2048, 8, 1), (1, 4096, 16, 1), (1, 1024, 4, 1), (1, 2048, 8, 3),
                                     (1, 1024, 4, 3), (2, 1024, 8, 2), (4, 512, 8, 2), (1, 1024, 1, 3),
                                     (1, 2048, 2, 3), (1, 512, 1, 2), (2, 512, 2, 3)):
        if rblock < 2 * next_pow2(max(inner, 1)) and x <= next_pow2(outer):
            out.append(_config(x, rblock, warps, stages=stages))
    return out or [_config(1, 1024, 4)]


def pointwise_choices(outer: int, hints: KernelHints, sms: int = DEFAULT_SMS) -> list[Config]:
    """A large pointwise kernel's candidates: the heuristic's 16 bytes per thread and load, twice
    that (two loads in flight per thread), and half of it with twice the warps. Which is fastest
    depends on the GPU's memory system and on the kernel's arithmetic, by up to 5%
    (bench/RESULTS.md, bench/bandwidth_probe.py): relu(x) + y + 1 in fp32 wants 8 bytes and 8
    warps on an H100 and 16 bytes on an H200; gelu in fp32 wants 32 bytes on an H200; bias +
    gelu in bf16 wants 32 bytes on both."""
    first = heuristic("pointwise", outer, 1, hints, sms)[0]
    x, w = first["XBLOCK"], first["num_warps"]
    return [first, _config(2 * x, 1, w), _config(x, 1, 2 * w)]


def timed(kind: str, outer: int, hints: KernelHints, tuning: str, forced: Config | None = None) -> bool:
    """Are this bucket's candidates timed (once, remembered on disk) rather than the first taken?
    All of them with ``tuning="full"``; with ``"heuristic"``, those of large pointwise kernels
    (``pointwise_choices``) whose configuration the user did not force. Never a kernel that adds
    into its output (each timing run would add again)."""
    if hints.accumulates:
        return False
    return tuning == "full" or (not forced and kind == "pointwise" and outer >= TIMED_POINTWISE)


def candidates(kind: str, outer: int, inner: int, hints: KernelHints, tuning: str, sms: int = DEFAULT_SMS,
               forced: Config | None = None) -> list[Config]:
    """What to try, in order: untimed (``timed``), the first that compiles is used; timed, all
    are, the heuristic's choice first among them."""
    picked = heuristic(kind, outer, inner, hints, sms)
    if timed(kind, outer, hints, tuning) and tuning == "heuristic":
        found = _dedupe(pointwise_choices(outer, hints, sms) + picked[1:])
    elif tuning == "full" and not hints.accumulates:
        found = _dedupe(picked[:1] + [c for c in exhaustive(kind, outer, inner)
                                      if hints.splittable or c.get("SPLIT", 1) == 1])
    else:
        found = picked
    if not forced:
        return found
    if "XBLOCK" in forced:  # (a kernel of fewer rows takes fewer: a full reduction's one row)
        forced = {**forced, "XBLOCK": min(forced["XBLOCK"], next_pow2(max(outer, 1)))}
    pool = found + ([] if tuning == "full" else exhaustive(kind, outer, inner))
    matching = [c for c in pool if all(c.get(k) == v for k, v in forced.items())]
    return _dedupe(matching) or [{**found[0], **forced}]


def _dedupe(configs: list[Config]) -> list[Config]:
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted({"num_stages": 1, **c}.items()))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
