"""Triton kernel bodies of reductions: rows and full reductions looped over RBLOCK chunks,
partials combined by the last program to finish, reductions over all rows, column sums in runs.

``LoopBodies`` is a part of codegen/triton.py's ``TritonKernelRenderer`` (its base class), kept
apart so that each file reads in one sitting: it uses the renderer's values, masks and index
setup. The functions below decide which of these bodies a kernel gets; the launcher
(runtime/triton_backend.py) sizes grids and workspaces from the same answers."""

from __future__ import annotations

from ..ir import dtypes as dt
from ..ir.ops import Op
from ..schedule.kernel_ir import CHUNK, FINAL_STAGE, SEGMENT_LENGTH, Kernel, Value, outer_var
from .online_softmax import guards_infinities, online_softmax_pairs, terms_lost_below_one
from .triton_alu import combine_fn, neutral, typed_neutral

_ACC = {dt.float32: "float32", dt.float64: "float64"}  # chunk sums' (float) accumulators
ROW_GROUP = 64  # programs of a row kernel that count their shares of a reduction over rows together


def loop_kind(kernel: Kernel) -> str:
    """The kind without the layout analysis of pointwise kernels (``triton.transposed``), for
    checks that only ask whether a kernel reduces rows or all of its elements."""
    if kernel.dots:
        return "matmul"  # codegen/triton_matmul.py
    if kernel.n_loops == 0:
        return "pointwise"
    return "rows" if kernel.outer else "full"


def max_in_use(s: Value, m: str) -> str:
    """The max an online softmax sum ``s`` subtracts, given the running max ``m``: as the graph
    has it, 0 where the max is -inf (every term so far is exp(-inf) = 0) and, behind logsumexp's
    guard, where it is +inf too; else the max itself."""
    if guards_infinities(s):
        return f"tl.where(tl.abs({m}) == float('inf'), 0.0, {m})"
    return f"tl.where({m} == float('-inf'), 0.0, {m})"


def _one_pass(kernel: Kernel) -> bool:
    """Does a row kernel read its rows in one loop: one loop of reductions, or online softmax's
    two (the second loop's sums accumulate in the first)?"""
    online = online_softmax_pairs(kernel)
    return kernel.n_loops == 1 or (kernel.n_loops == 2 and all(v in online for v in kernel.reductions if v.loop == 2))


def multi_program(kernel: Kernel) -> bool:
    """Does a full reduction combine partials from many programs (else it runs as one)? Partials
    travel through a 64-bit workspace (float64, or int64 for integer reductions); arg-reductions
    run as one program."""
    return (loop_kind(kernel) == "full" and kernel.n_loops == 1
            and all(v.arg.op not in (Op.ARGMAX, Op.ARGMIN) for v in kernel.reductions))


def split_rows(kernel: Kernel) -> bool:
    """Can a row kernel split its rows over several programs (``_looped(split=True)``)? One pass
    over the rows (``_one_pass``), so partials combine in any order. Reductions over all rows (a
    mean loss) follow in the program that finishes each row block. Stores inside the pass are
    each slice's own elements, computed before any reduction is done (a bias gradient's column
    sums of the gradient the kernel stores), so only online softmax's second loop, whose stores
    need the row's max and sum, keeps its rows whole."""
    return (loop_kind(kernel) == "rows" and _one_pass(kernel)
            and not kernel.chunks and not (kernel.row_reductions and kernel.segment_length is not None)
            and bool(kernel.reductions)
            and all(v.arg.op not in (Op.ARGMAX, Op.ARGMIN) for v in kernel.reductions)
            and (kernel.n_loops == 1 or not any(v.kind == "store" and v.inner for v in kernel.values)))


def _integer_partial(v: Value) -> bool:
    dtype = v.srcs[0].dtype
    return not dtype.is_float and not dtype.is_bool


class LoopBodies:
    """The reduction bodies of ``TritonKernelRenderer`` (see the module docstring)."""

    def _split_looped(self, keyword: str) -> None:
        """The branch of a row kernel whose rows split over programs (``split_rows``)."""
        self.emit(f"{keyword} NPROG_BLOCK > 1:  # the rows split over tl.num_programs(1) programs")
        self.depth += 1
        self._looped(full=False, split=True)
        self.depth -= 1
    def _chunked(self) -> None:
        """A row kernel that also sums columns: program c walks run c of the rows (XBLOCK at a
        time) and adds each row into its partial column sums, kept in registers when the row is
        (PERSISTENT), else in the run's row of the partials buffer; then stores them at CHUNK."""
        k = self.k
        self.emit(f"{CHUNK.name} = tl.program_id(0).to(tl.int64 if BIG else tl.int32)")
        self.emit(f"per = tl.cdiv(OUTER, {k.chunks})  # rows per run")
        self.emit(f"row0 = {CHUNK.name} * per")
        self.emit("row_end = tl.minimum(row0 + per, OUTER)")
        self.emit("if PERSISTENT:")
        self.depth += 1
        self._r_setup("0")
        for v in k.chunk_stores:
            self.emit(f"part{self.name(v)} = tl.zeros([XBLOCK, RBLOCK], tl.{_ACC[v.srcs[0].dtype]})")
        self._row_block()
        self.chunk_acc = True
        self._persistent(setup=False)
        self.chunk_acc = False
        self.depth -= 1
        for v in k.chunk_stores:
            self.emit(f"{self.name(v.srcs[0])} = tl.sum(part{self.name(v)}, 0)[None, :]")
            self.emit(f"tl.store({self._pointer(v)}, {self.name(v.srcs[0])}, rmask)")
        self.depth -= 1
        self.emit("else:")
        self.depth += 1
        self.emit("for roffset in range(0, INNER, RBLOCK):  # the run's partial sums start at zero")
        self.depth += 1
        self._r_setup("roffset")
        for v in k.chunk_stores:
            self.emit(f"tl.store({self._pointer(v)}, tl.zeros([1, RBLOCK], tl.{_ACC[v.srcs[0].dtype]}), rmask)")
        self.depth -= 1
        self.emit("tl.debug_barrier()")
        self._row_block()
        self._looped(full=False)
        self.depth -= 2

    def _row_block(self) -> None:
        """Open the loop over a run's rows, XBLOCK at a time."""
        self.emit("for xstart in range(row0, row_end, XBLOCK):")
        self.depth += 1
        self.emit("xindex = xstart + tl.arange(0, XBLOCK)[:, None]")
        self.emit("xmask = xindex < row_end")
        self._decompose("xindex", self.k.outer, outer_var)

    def _persistent(self, setup: bool = True) -> None:
        """The whole row in registers: values in order, each reduction over the tile."""
        if setup:
            self._r_setup("0")
        for v in self.k.values:
            if v.kind == "reduce":
                position = self._position(v) if v.arg.op in (Op.ARGMAX, Op.ARGMIN) else None
                self.emit(f"{self.name(v)} = {self.reduce_block(v, self._masked(v), position)}")
            elif v.inner or v.stage != FINAL_STAGE:  # (after all rows: _combine_rows)
                self.statements([v])

    def _looped(self, full: bool, split: bool = False) -> None:
        """Rows (or the whole reduction, ``full``) in RBLOCK chunks. Partials from many programs
        are combined by the last to finish: a full reduction's (``multi_program``), or each row
        block's when its rows are split over programs (``split``, see ``split_rows``)."""
        k = self.k
        outer_values = [v for v in k.values if not v.inner and v.kind != "reduce"]
        multi = full and multi_program(k)
        partials = multi or split
        online = {} if multi else online_softmax_pairs(k)  # sum -> the max it rescales against
        bound = "longest" if k.segment_length is not None else "INNER"
        if split:
            self.emit("nsplit = tl.num_programs(1)")
        for stage in range(k.n_loops + 1):
            self.statements([v for v in outer_values if v.stage == stage and not (partials and stage > 0)])
            if stage == 0 and k.segment_length is not None:
                self.emit(f"{SEGMENT_LENGTH.name} = {self.name(k.segment_length)}  # each row's length")
                self.emit(f"longest = tl.max({SEGMENT_LENGTH.name})  # the block's rows loop as long as its longest")
            if stage == 0 and split:
                self.emit(f"per_slice = tl.cdiv(tl.cdiv({bound}, nsplit), RBLOCK) * RBLOCK  # whole blocks")
                self.emit("rstart = tl.program_id(1) * per_slice")
            if stage == k.n_loops:
                break
            loop = stage + 1
            reductions = [v for v in k.reductions if v.loop == loop and v not in online]
            stores = [v for v in k.values if v.kind == "store" and v.inner and v.loop == loop]
            if not reductions and not stores:
                continue  # its only work moved into the previous loop (online softmax)
            partners = [s for s, m in online.items() if m in reductions]
            for m in dict.fromkeys(online[v] for v in partners):  # a running max per row, not per lane
                # (kept as [XBLOCK] vectors, expanded only against the chunk: a [XBLOCK, 1] value
                # is held, and computed, once per element of the chunk a thread holds)
                # (through eh.opaque: a constant start trips a Triton 3.6 compile crash, see there)
                self.emit(f"row_max{self.name(m)} = eh.opaque(tl.full([XBLOCK], float('-inf'), tl.float32))")
            for v in partners:  # and a running sum each (a softmax and a logsumexp may share a max)
                self.emit(f"row_sum{self.name(v)} = tl.full([XBLOCK], 0, tl.float32)")
            for v in reductions:
                if any(online[p] is v for p in partners):
                    continue
                acc = f"acc{self.name(v)}"
                shape = "[XBLOCK, RBLOCK]"
                self.emit(f"{acc} = tl.full({shape}, {neutral(v.arg.op, v.srcs[0].dtype)}, {self.acc_dtype(v)})")
                if v.arg.op in (Op.ARGMAX, Op.ARGMIN):
                    self.emit(f"{acc}_i = tl.full({shape}, 2**62, tl.int64)")
            if multi:
                self.emit("for roffset in range(tl.program_id(0) * RBLOCK, INNER, tl.num_programs(0) * RBLOCK):")
            elif split:
                self.emit(f"for roffset in range(rstart, tl.minimum(rstart + per_slice, {bound}), RBLOCK):")
            else:
                self.emit(f"for roffset in range(0, {bound}, RBLOCK):")
            self.depth += 1
            self._r_setup("roffset")
            # a softmax's terms that only add up next to the max's 1: one ex2.approx.ftz each
            self.spelled = {id(e): f"eh.exp_ftz({self.name(e.srcs[0])})" for e in terms_lost_below_one(k, loop)}
            self.statements(k.loop_values(loop))
            self.spelled = {}
            for v in reductions:
                acc = f"acc{self.name(v)}"
                fn = combine_fn(v.arg.op, v.srcs[0].dtype)
                sums = [s for s in partners if online[s] is v]
                if sums:
                    # the row's max so far, and its sums of exp rescaled whenever the max grows:
                    # one pass over the row instead of two, one exp per element and sum
                    m = f"row_max{self.name(v)}"
                    x = self._masked(v)
                    self.emit(f"chunk = {x}")
                    self.emit(f"m_new = eh.maximum({m}, tl.reduce(chunk, 1, eh.maximum))")
                    for partner in sums:
                        # exp(x - max) with the max taken as 0 while the row is all -inf so far (then
                        # every term is exp(-inf) = 0), as the graph's guard has it: a select per row
                        s_ = f"row_sum{self.name(partner)}"
                        self.emit(f"m_use = {max_in_use(partner, 'm_new')}")
                        self.emit(f"{s_} = {s_} * tl.exp({m} - m_use) + tl.sum(eh.exp_ftz(chunk - m_use[:, None]), 1)")
                    self.emit(f"{m} = m_new")
                elif v.arg.op in (Op.ARGMAX, Op.ARGMIN):
                    self.emit(f"{acc}, {acc}_i = {fn}({acc}, {acc}_i, {self._masked(v)}, {self._position(v)})")
                else:
                    self.emit(f"{acc} = {fn}({acc}, {self._masked(v)})")
            self.statements(stores)
            self.depth -= 1
            for v in reductions:
                acc = f"acc{self.name(v)}"
                position = f"{acc}_i" if v.arg.op in (Op.ARGMAX, Op.ARGMIN) else None
                if any(online[p] is v for p in partners):
                    self.emit(f"{self.name(v)} = row_max{self.name(v)}[:, None]")
                else:
                    self.emit(f"{self.name(v)} = {self.reduce_block(v, acc, position)}")
            for v in partners:
                self.emit(f"{self.name(v)} = row_sum{self.name(v)}[:, None]")
            if partials:
                self._combine_partials(reductions, outer_values, split, {s: online[s] for s in partners})

    def _combine_rows(self, after_slots: int | None = None) -> None:
        """Reductions over all rows, in two levels so that no program holds many partials (their
        registers would count against every program of the kernel: fewer resident, slower rows)
        and no counter is shared by thousands of programs. Each program writes its share (over
        its XBLOCK rows); the last of each group of ROW_GROUP programs combines the group's shares
        into a group partial; the last group combines those, ROW_GROUP at a time, and computes and
        stores what comes after all rows. Release-acquire chains make every share visible to it.
        With rows split over programs, the program that finished a row block writes its share
        (``after_slots``: the slices' partials and counters come first in the workspace)."""
        across = self.k.row_reductions
        if not across:
            return
        g = ROW_GROUP
        self.emit("# reductions over all rows: shares per program, per group of programs, then in total")
        if after_slots is None:
            self.emit("rows_ws, rows_counter = WORKSPACE, COUNTER")
        else:  # after the slices' partials, and after the row blocks' counters
            self.emit(f"rows_ws = WORKSPACE + {after_slots} * nsplit * OUTER")
            self.emit("rows_counter = COUNTER + tl.num_programs(0)")
        self.emit("nprog = tl.num_programs(0)")
        self.emit(f"ngroups = tl.cdiv(nprog, {g})")
        self.emit(f"group = tl.program_id(0) // {g}")
        shares, partials = [], []
        for i, v in enumerate(across):
            share, kind = self._slot(v, f"rows_ws + {i} * nprog")
            partial, _ = self._slot(v, f"rows_ws + {len(across)} * nprog + {i} * ngroups")
            shares.append(share)
            partials.append(partial)
            src, op, dtype = self.name(v.srcs[0]), v.arg.op, v.srcs[0].dtype
            mine = f"tl.reduce(tl.where(xmask, {src}, {typed_neutral(op, dtype)}), 0, {combine_fn(op, dtype)})"
            self.emit(f"tl.store({share} + tl.program_id(0) + tl.arange(0, 1), {mine}.to({kind}))")
        self.emit("tl.debug_barrier()  # every thread's shares are written before the count says so")
        self.emit("group_counter = rows_counter + 1 + group * 32  # a 128-byte line per group")
        self.emit("done = tl.atomic_add(group_counter, 1, sem='acq_rel')")
        self.emit(f"if done == tl.minimum(nprog - group * {g}, {g}) - 1:  # the group's last program")
        self.depth += 1
        self.emit("tl.store(group_counter, 0)  # ready for the next launch")
        self.emit(f"q = group * {g} + tl.arange(0, {g})[None, :]")
        for v, share, partial in zip(across, shares, partials):
            self.emit(self._gathered(v, share, "q < nprog"))
            kind = self._slot(v, "")[1]
            self.emit(f"tl.store({partial} + group + tl.arange(0, 1), tl.reshape(part, [1]).to({kind}))")
        self.emit("tl.debug_barrier()")
        self.emit("groups_done = tl.atomic_add(rows_counter, 1, sem='acq_rel')")
        self.emit("if groups_done == ngroups - 1:  # the last group: the totals")
        self.depth += 1
        for v in across:
            start = neutral(v.arg.op, v.srcs[0].dtype)
            self.emit(f"total{self.name(v)} = tl.full([1, 1], {start}, {self.acc_dtype(v)})")
        self.emit(f"for g0 in range(0, ngroups, {g}):")
        self.depth += 1
        self.emit(f"q = g0 + tl.arange(0, {g})[None, :]")
        for v, partial in zip(across, partials):
            self.emit(self._gathered(v, partial, "q < ngroups"))
            self.emit(f"total{self.name(v)} = {combine_fn(v.arg.op, v.srcs[0].dtype)}(total{self.name(v)}, part)")
        self.depth -= 1
        for v in across:
            self.emit(f"{self.name(v)} = total{self.name(v)}")
        self.statements(self.k.after_rows()[1])  # (their inputs were computed before the rows)
        self.emit("tl.store(rows_counter, 0)  # ready for the next launch")
        self.depth -= 2

    def _gathered(self, v: Value, slot: str, mask: str) -> str:
        """``part = `` the combination of the partials at ``slot + q`` (a [1, 1] tensor)."""
        op, dtype = v.arg.op, v.srcs[0].dtype
        load = f"tl.load({slot} + q, {mask}, other={neutral(op, dtype)}, volatile=True).to({self.acc_dtype(v)})"
        return f"part = tl.reduce({load}, 1, {combine_fn(op, dtype)})[:, None]"

    def _slot(self, v: Value, slot: str) -> tuple[str, str]:
        """A reduction's partials in the float64 workspace; integer partials keep all 64 bits
        (the same slots, seen as int64)."""
        if _integer_partial(v):
            return f"({slot}).to(tl.pointer_type(tl.int64), bitcast=True)", "tl.int64"
        return slot, "tl.float64"

    def _combine_partials(self, reductions: list[Value], outer_values: list[Value], split: bool,
                          online: dict[Value, Value]) -> None:
        """Write this program's partials; the last program to finish (of its row block, when the
        rows are split) combines them and runs the epilogue (everything after the loop). An online
        softmax sum (``online``: sum -> its max) is each slice's sum of exp(x - its own max): the
        combine rescales each to the row's max, sum(s_i * exp(m_i - max)), where a slice with
        nothing above -inf adds 0."""
        if split:  # a partial per row of the block from each slice, a count per row block
            self.emit("nprog = nsplit")
            base, mask, counter = "nprog * OUTER", "xmask & ", "COUNTER + tl.program_id(0)"

            def at(part: str) -> str:
                return f"{part} * OUTER + xindex"
            mine = at("tl.program_id(1)")
        else:  # one partial per program
            self.emit("nprog = tl.num_programs(0)")
            base, mask, counter = "nprog", "", "COUNTER"

            def at(part: str) -> str:
                return f"{part} + tl.arange(0, 1)[:, None]"
            mine = at("tl.program_id(0)")
        slots = {}
        for i, v in enumerate(reductions + list(online)):
            slot, kind = self._slot(v, f"WORKSPACE + {i} * {base}")
            slots[v] = slot
            self.emit(f"tl.store({slot} + {mine}, {self.name(v)}.to({kind}){', xmask' if split else ''})")
        self.emit("tl.debug_barrier()  # every thread's partials are written before the count says so")
        self.emit(f"done = tl.atomic_add({counter}, 1, sem='acq_rel')")
        self.emit("if done == nprog - 1:")
        self.depth += 1
        self.emit("p = tl.arange(0, NPROG_BLOCK)[None, :]")

        def parts(v: Value) -> str:
            return (f"tl.load({slots[v]} + {at('p')}, {mask}(p < nprog), other={neutral(v.arg.op, v.srcs[0].dtype)}, "
                    f"volatile=True).to({self.acc_dtype(v)})")
        for v in reductions:  # (loaded once: an online max's partials also rescale the sums below)
            self.emit(f"part{self.name(v)} = {parts(v)}")
            self.emit(f"{self.name(v)} = {self.reduce_block(v, f'part{self.name(v)}')}")
        for s_, m in online.items():
            self.emit(f"m_use = {max_in_use(s_, self.name(m))}")
            self.emit(f"{self.name(s_)} = tl.sum({parts(s_)} * tl.exp(part{self.name(m)} - m_use), 1)[:, None]")
        self.statements([v for v in outer_values if 1 <= v.stage != FINAL_STAGE])
        if split:  # this program finished its row block: its share of the reductions over all rows
            self._combine_rows(after_slots=len(slots))
        self.emit(f"tl.store({counter}, 0)  # ready for the next launch")
        self.depth -= 1
