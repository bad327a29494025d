"""Fusion: which nodes get a buffer, and which buffers one kernel computes together.

1. Buffers are needed for graph outputs and ATen-call arguments (a view of a node that has a
   buffer anyway is replayed as an ATen view instead, keeping eager's aliasing, unless ATen's
   reshape would copy it anyway: attention's heads flattened for ``bmm`` are copied by a kernel).
2. Each buffered node is a *root*. A root's kernel domain is its reduction's (outer rows x inner
   reduce extent) when its unbuffered inputs contain a reduction, else its own shape (the rules:
   schedule/domains.py). Roots with
   the same domain share a kernel (softmax = one kernel with three loops; the padded GIoU loss =
   one kernel with two sums and its scalar epilogue), unless that would make a cycle (cycles.py).
3. Everything between roots is inlined: pointwise producers are recomputed where used, unless
   several kernels would recompute something costly (many ops, or many full-size buffers to
   read: a residual stream summed over the layers), which then gets a buffer of its own.
4. Building a kernel can reveal a reduction that does not fit its loops (``NeedsBuffer``) or a
   root read at a shifted point (``Conflict``); the plan is adjusted and rebuilt.
5. The kernels, ATen calls and replayed views become ordered steps (schedule/steps.py).
"""

from __future__ import annotations

import sympy

from ..config import Config
from ..ir import shapes as sh
from ..ir.node import Graph, Node, aten_result_strides, fill_value, ragged_totals, view_base
from ..ir.ops import POINTWISE_OPS, REDUCE_OPS, TRANSCENDENTAL_OPS, VIEW_OPS, Op
from .buffer_layouts import operand_order
from .build import KernelBuilder
from .build_reduce import cast_read, jump_read, saved_read
from .cycles import CycleChecks
from .device_sizes import read_totals_on_device
from .domains import DomainRules
from .group_spec import BUFFER_OPS, AcrossFailed, BufferInfo, Conflict, GroupSpec, NeedsBuffer, crosswise
from .guards import guard_branches
from .indexing import base_layout, replay_copies
from .kernel_ir import CHUNK, Kernel
from .loops import collapse_dims, memory_ordered_dims, simplify_with_ranges, split_inner_by_divisor
from .reuse import CountedDict, CountedSet, RecordedReads
from .steps import Schedule, StepOrder, _symbols, copied_base

COMPUTE_OPS = POINTWISE_OPS | REDUCE_OPS | VIEW_OPS | frozenset({
    Op.CONST, Op.IOTA, Op.GATHER, Op.INDEX, Op.SEARCH, Op.CAT, Op.PAD, Op.SEGMENT_REDUCE, Op.CHUNK_SUM,
    Op.MATMUL, Op.SCAN})


class Planner(DomainRules, StepOrder, CycleChecks):
    """Plans a graph's buffers and kernels; the domain rules are ``DomainRules`` (domains.py), the
    step order ``StepOrder`` (steps.py), the cycle checks ``CycleChecks`` (cycles.py)."""

    def __init__(self, graph: Graph, cfg: Config, gpu: bool = False, hints: dict[sympy.Symbol, int] | None = None):
        self.graph = graph
        self.cfg = cfg
        self.gpu = gpu  # kernels for a GPU: passes over few long rows split (domains.py: few_long_rows)
        self.hints = hints or {}  # symbolic sizes' values in this compile's example (domains.py: few_long_rows)
        self.users = graph.users()
        self.order = {n: i for i, n in enumerate(graph.nodes)}
        self.buffered: set[Node] = CountedSet()  # compute nodes that get a buffer
        self.views: dict[Node, Node] = CountedDict()  # replayed views -> their buffered base
        self.copied_views: set[Node] = set()   # views ATen would copy: a kernel copies them
        self.apart: set[frozenset[Node]] = set()  # root pairs that must not share a kernel
        self.unrolled: dict[Node, int] = {}    # roots storing a small dim position by position
        self.segment_of: dict[Node, tuple[Node, sympy.Expr]] = {}  # segment roots -> (offsets, T)
        self._optimistic = False
        self.shared: set[Node] = set()         # buffered so several kernels need not recompute them
        self.released: set[Node] = set()       # ... then found to be read by their own kernel only
        self.not_across: set[Node] = set()     # reductions over rows a row kernel cannot finish
        self._across: dict[Node, GroupSpec] = {}  # root -> the row group domain() offered it
        self.matmul_roots: set[Node] = set()   # roots whose domain is a matmul's (M, N) x K
        self.scan_roots: dict[Node, bool] = {}  # roots whose domain is a scan's rows -> walked from their end?
        self.totals = ragged_totals(graph)     # ragged totals kernels read on the device
        self.held = jump_read(graph.nodes, self.users, graph.outputs)  # 16-bit roots stored as eager holds them
        self.converted = cast_read(graph.nodes, self.users)  # 16-bit values differences read rounded
        self.saved = saved_read(graph)  # 16-bit values all read rounded
        # subtrees while buffers and views stay as they are: (changes seen, root -> subtree)
        self._subtrees: tuple[tuple[int, int], dict[Node, tuple[Node, ...]]] = ((-1, -1), {})
        self._reach: dict[Node, int] | None = None  # (the dependency walk's, made on first use)
        self._reused = 0  # kernel builds taken from an earlier attempt
        # kernels built by earlier attempts: roots -> [(spec, subtrees, buffer lookups, kernel)]
        self._built: dict[tuple[Node, ...], list[tuple[GroupSpec, list, dict, Kernel]]] = {}
        self._choose_initial_buffers()

    # ---- 1. buffers the program needs ------------------------------------------------------
    def _need_tensor(self, node: Node) -> None:
        """``node`` must exist as a real tensor (an output or an ATen argument)."""
        if node.op in BUFFER_OPS:
            return
        if node.op in VIEW_OPS:
            base = self._tensor_below(node)
            if base is not None and base.op in BUFFER_OPS and replay_copies(node, base):
                # ATen's reshape would copy it anyway: a kernel copies it, tiled where it
                # transposes (ATen's strided copies of a GPT's heads ran at 20-45% of copy bandwidth)
                self.copied_views.add(node)
                base = None
            if base is not None:
                self.views[node] = base
                if base.op not in BUFFER_OPS:
                    self.buffered.add(base)
                return
        self.buffered.add(node)

    def _tensor_below(self, view: Node) -> Node | None:
        """The nearest tensor down ``view``'s chain of views that the program has anyway (an
        input, an ATen result, a buffer, an output), from which ATen can replay the chain."""
        n = view.inputs[0]
        while True:
            if n in self.views:
                return self.views[n]
            if n.op in BUFFER_OPS or n in self.buffered or n in self._output_set:
                return n
            if n.op not in VIEW_OPS:
                return None
            n = n.inputs[0]

    def _replay_views(self) -> None:
        """Buffered views whose chain now reaches a buffer (buffered since, for sharing or for a
        reduction): replayed from it, not copied by a kernel. A kernel computing both a buffer
        and a permuted copy of it would read its own root at another point."""
        for node in sorted((n for n in self.buffered if n.op in VIEW_OPS and n not in self.copied_views),
                           key=self.order.__getitem__):
            base = self._tensor_below(node)
            if base is not None:
                self.buffered.discard(node)
                self.views[node] = base
        for view, base in self.views.items():  # (views replayed from one of those: from its base)
            while base in self.views:
                base = self.views[base]
            self.views[view] = base

    def _choose_initial_buffers(self) -> None:
        self._output_set = {o for i, o in enumerate(self.graph.outputs)
                            if o is not None and i not in self.graph.scalar_outputs}
        for node in self._output_set:
            if node.op not in VIEW_OPS and node.op not in BUFFER_OPS:
                self.buffered.add(node)
        # outputs that are views of one value (y = x.exp(); return y[1:], y[:2]) share its memory
        # in eager, where a write into one shows in the other: the value gets a buffer they are
        # replayed from (where eager's values were distinct and CSE merged them, the wrapper
        # copies: codegen/wrapper.py, _shared_outputs). Only in inference graphs: a training
        # forward's outputs are mostly tensors saved for the backward (a loss's box columns),
        # which no user sees, and AOTAutograd rebuilds the user's views of one value itself.
        viewed: dict[Node, int] = {}
        for node in self._output_set if self.graph.name.startswith("inference") else ():
            if node.op in VIEW_OPS:
                base = view_base(node)
                viewed[base] = viewed.get(base, 0) + 1
                if viewed[base] == 2 and base.op not in BUFFER_OPS:
                    self.buffered.add(base)
        # (in graph order: a view output is placed after the output it views, so it is replayed
        # from that one's base; in a set's order a slice seen before the permute it slices made
        # the permute a buffer, copied by a kernel, and the plan differed from run to run)
        for node in sorted(self._output_set, key=self.order.__getitem__):
            self._need_tensor(node)
        for node, strides in zip(self.graph.outputs, self.graph.output_strides):
            if node in self.buffered and node.op in VIEW_OPS and strides is not None and any(
                    sh.equal(st, 0) and not sh.is_one(n) for st, n in zip(strides, node.shape)):
                # eager returns a broadcast view (x.sum(0).expand(3, 4)): so does the program, of
                # its base's buffer, rather than storing every repeated element
                base = view_base(node)
                self.buffered.discard(node)
                if base.op not in BUFFER_OPS:  # (an input is no kernel's root: planning got stuck)
                    self.buffered.add(base)
                self.views[node] = base
        for node in self.graph.nodes:
            if node.op is Op.EXTERN:
                for x in node.inputs:
                    self._need_tensor(x)
            if node.op is Op.INDEX_PUT:
                # its kernel adds into a buffer that already holds the tensor written into
                self.buffered.add(node)
                if fill_value(node.inputs[0]) is None:
                    self._need_tensor(copied_base(node))
            if not self.cfg.fusion and node.op in POINTWISE_OPS | REDUCE_OPS | {Op.SEGMENT_REDUCE, Op.SCAN}:
                self.buffered.add(node)
            if node.op is Op.CHUNK_SUM:  # partials for another kernel to add up: always stored
                self.buffered.add(node)
        for node in self.graph.nodes:
            if node.op in (Op.GATHER, Op.INDEX) and node not in self.buffered and self._index_read_partly(node):
                self.buffered.add(node)

    def _index_read_partly(self, gather: Node) -> bool:
        """Whether a kernel inlining ``gather`` may evaluate it at only some of its index's
        elements (``x[i][:2]``, ``torch.gather(x, 1, i)[:, :1]``): an index out of range there
        would go unchecked, where eager raises. Such a gather gets a buffer, computed and checked
        whole. A slice along dims the index does not cover (a box's coordinates,
        ``x[rows, pos][:, 0]``) reads every index element still."""
        indexed = (frozenset(range(gather.rank)) if gather.op is Op.GATHER
                   else frozenset(range(gather.arg, gather.arg + gather.inputs[1].rank)))
        # (node, its dims that are the gather's indexed dims; None past a reshape, permute or
        # broadcast, where any narrowing slice counts)
        stack: list[tuple[Node, frozenset[int] | None]] = [(gather, indexed)]
        seen: set[tuple[Node, frozenset[int] | None]] = set()
        while stack:
            n, dims = stack.pop()
            for user in self.users.get(n, ()):
                if user.op is Op.SLICE:
                    dim = user.arg[0]
                    if not sh.equal(user.shape[dim], n.shape[dim]) and (dims is None or dim in dims):
                        return True
                    follow = dims
                elif user.op in (Op.GATHER, Op.INDEX) and user.inputs[0] is n:
                    return True  # read at data-dependent points
                elif user.op is Op.GATHER or user.op is Op.INDEX and all(
                        sh.shapes_equal(i.shape, n.shape) for i in user.inputs[1:]):
                    # an index of another gather: its dims are that gather's indexed dims
                    follow = None if dims is None else frozenset(
                        d + (user.arg if user.op is Op.INDEX else 0) for d in dims)
                else:  # (a reduction's rows, a concatenation's part: what is sliced later counts)
                    same = user.op in POINTWISE_OPS and sh.shapes_equal(user.shape, n.shape)
                    follow = dims if same else None
                if user not in self.buffered and (user, follow) not in seen:
                    # (a buffer is computed whole: its readers read it)
                    seen.add((user, follow))
                    stack.append((user, follow))
        return False

    # ---- 2. domains and groups ------------------------------------------------------------
    def subtree(self, root: Node) -> tuple[Node, ...]:
        """Unbuffered compute nodes a root inlines (excluding the root), in graph order."""
        state = (self.buffered.changes, self.views.changes)
        if self._subtrees[0] != state:
            self._subtrees = (state, {})
        cached = self._subtrees[1].get(root)
        if cached is None:
            cached = self._subtrees[1][root] = self._walk_subtree(root)
        return cached

    def _walk_subtree(self, root: Node) -> tuple[Node, ...]:
        seen: set[Node] = set()
        # a write at indices computes its values and indices; the tensor written into is copied
        stack = list(root.inputs[1:] if root.op is Op.INDEX_PUT else root.inputs)
        while stack:
            n = stack.pop()
            if n in seen or n in self.buffered or n.op not in COMPUTE_OPS or n in self.views:
                continue
            seen.add(n)
            stack.extend(n.inputs)
        return tuple(sorted(seen, key=self.order.__getitem__))

    def reads(self, root: Node) -> set[Node]:
        """Buffered nodes (of any kind) a root's kernel reads."""
        out: set[Node] = set()
        for n in [root, *self.subtree(root)]:
            for x in n.inputs:
                if x in self.buffered or x.op in BUFFER_OPS or x in self.views:
                    out.add(self.views.get(x, x))
        return out

    def form_groups(self) -> list[GroupSpec]:
        """Group roots by domain. First optimistically: a root not grouped yet is assumed to join
        the kernel that reads it (the saved columns of a loss kernel join it, so a root they read
        can too); if some root did not, and kernels now need each other, group again without."""
        groups = self._form_groups(optimistic=True)
        if self._acyclic(groups):
            return groups
        groups = self._form_groups(optimistic=False)
        if self._acyclic(groups):
            return groups
        # Root-level checks miss cycles through a third kernel (a kernel that needs A joins B,
        # which another root of A reads): check whole kernels at every join, and as a last
        # resort give every root a kernel of its own (buffers follow the graph, a DAG).
        groups = self._form_groups(optimistic=False, checked=True)
        if self._acyclic(groups):
            return groups
        return self._form_groups(optimistic=False, alone=True)

    def _form_groups(self, optimistic: bool, checked: bool = False, alone: bool = False) -> list[GroupSpec]:
        self._optimistic = optimistic
        roots = sorted(self.buffered, key=self.order.__getitem__)
        groups: list[GroupSpec] = []
        owner: dict[Node, GroupSpec] = {}
        # Reductions first, so pointwise roots can join the reduction groups they match; chunk sums
        # last, so they find the row kernels they join.
        roots.sort(key=lambda n: (n.op is Op.CHUNK_SUM, not self._has_reduction(n), self.order[n]))
        for root in roots:
            outer, inner, home, ref = self.domain(root, groups)
            rows = self._across.pop(root, None)
            target = self._target(root, [rows] if rows else groups, groups, owner, outer, inner, checked, alone,
                                  ref)
            if rows is not None and target is None:
                # its row kernel cannot take it (a cycle): a full reduction of its own after all
                self.not_across.add(root)
                outer, inner, home, ref = self.domain(root, groups)
                target = self._target(root, groups, groups, owner, outer, inner, checked, alone, ref)
            elif rows is not None:
                rows.final = True
            if (target is None and (ref is not None or root in self.matmul_roots)
                    and root not in self.segment_of and not self._has_reduction(root)):
                # a pointwise root offered a group's domain (a column sum's, to share its loads)
                # that it may not join: alone, it walks its own shape, not the group's loops
                # (a GPT's gelu over (3072 columns) x (rows): 3.6x the time in CUDA C++)
                outer, inner, home, ref = self.domain(root, [])
            if target is None:
                segment, total = self.segment_of.get(root, (None, None))
                target = GroupSpec([], {}, outer, inner, ref, segment=segment, segment_total=total,
                                   matmul=root in self.matmul_roots, scan=self.scan_roots.get(root))
                groups.append(target)
            target.roots.append(root)
            target.homes[root] = home
            if home and home[0] == CHUNK:
                target.chunks = root.arg[1]
            if root in self.unrolled:
                target.unrolled[root] = self.unrolled[root]
            owner[root] = target
        for g in groups:
            g.roots.sort(key=self.order.__getitem__)
        return groups

    def _target(self, root: Node, candidates: list[GroupSpec], groups: list[GroupSpec],
                owner: dict[Node, GroupSpec], outer: tuple, inner: tuple, checked: bool, alone: bool,
                ref: tuple | None = None) -> GroupSpec | None:
        """The first of ``candidates`` over the same domain that ``root`` (whose reduction set
        its domain from ``ref``) may join."""
        for g in candidates:
            if (len(g.outer) == len(outer) and len(g.inner) == len(inner)
                    and all(sh.equal(a, b) for a, b in zip(g.outer + g.inner, outer + inner))
                    and not crosswise(g.ref, ref)
                    and (g.segment, g.segment_total) == self.segment_of.get(root, (None, None))
                    and g.matmul == (root in self.matmul_roots) and g.scan is self.scan_roots.get(root)
                    # a chunked kernel cannot finish reductions over all its rows (its runs of
                    # rows end apart): chunk sums stay out of a row kernel that does
                    and not (root.op is Op.CHUNK_SUM and g.final)
                    and self.cfg.fusion and not alone and not self._blocked(root, g, owner)
                    and not (g.matmul and self._another_first_operand(root, g))
                    and not self.second_pass(root, g)
                    and not (checked and self._closes_cycle(root, g, groups))):
                return g
        return None

    def _another_first_operand(self, root: Node, group: GroupSpec) -> bool:
        """Would ``root`` bring ``group`` a product whose first operand its products do not share?
        A kernel's products share their first operand, the loads of whose tiles serve all of
        them (a gated MLP's two projections); the CUDA backend's template computes no other
        pair. A CLIP loss's backward put G @ b and G.T @ a, of one shape, in one kernel, which
        that backend then refused (its products ran through ATen, with a warning)."""
        mine = {n.inputs[0] for n in [*self.subtree(root), root] if n.op is Op.MATMUL}
        if not mine:
            return False
        theirs = {n.inputs[0] for r in group.roots for n in [*self.subtree(r), r] if n.op is Op.MATMUL}
        return len(mine | theirs) > 1

    def _has_reduction(self, root: Node) -> bool:
        reducing = REDUCE_OPS | {Op.SEGMENT_REDUCE, Op.MATMUL}
        return root.op in reducing or any(n.op in reducing for n in self.subtree(root))

    # ---- 3. recomputation ------------------------------------------------------------------
    def costly_shared(self, groups: list[GroupSpec]) -> set[Node]:
        """Inlined nodes that several kernels would each recompute, and that cost too much.
        Reductions first: what a value costs to recompute is counted once they have buffers (a
        log-softmax, x - max - log(sum), is a few ops over its row statistics, not the sum's exp
        and log again; counted with them, a loss and its gradient over a (8192, 32000) matrix
        stored the log-softmax and read back its 1 GB of float32)."""
        reached: dict[Node, set[int]] = {}
        for gi, g in enumerate(groups):
            for root in g.roots:
                for n in self.subtree(root):
                    reached.setdefault(n, set()).add(gi)
        shared = [n for n, gs in reached.items() if len(gs) > 1 and n.op not in VIEW_OPS and n.op is not Op.CONST]
        reductions = {n for n in shared if n.op in REDUCE_OPS or n.op in (Op.SEGMENT_REDUCE, Op.MATMUL, Op.SCAN)}
        return reductions or {n for n in shared if self._cost(n) > self.cfg.max_recompute_ops
                              or self._full_reads(n) > self.cfg.max_recompute_reads}

    def costly_broadcast(self, groups: list[GroupSpec]) -> set[Node]:
        """Inlined values with a transcendental op in them that a kernel would recompute at
        ``cfg.max_broadcast_recompute`` or more times their own number of elements, where the
        kernel reads them broadcast: a rotary embedding's cos and sin of position x frequency,
        (T, D/2), at every (B, T, H, D) element. They get a buffer, computed once. Only the last
        such values before the broadcast (sin and cos, not the angles under them); only static
        sizes; only values of the graph's inputs, indices and constants, with no reduction under
        them (a norm backward's coefficients, from its row sums, stay as planned),
        in pointwise kernels (a row kernel computes a row's values once a row). CPU kernels
        only: a GPU kernel's arithmetic hides under its memory traffic, and another kernel would
        cost a launch."""
        out: set[Node] = set()
        for g in groups:
            domain = sh.static(sh.numel(g.outer))
            if self.gpu or g.inner or g.matmul or g.scan is not None or g.segment is not None or not domain:
                continue
            inlined = {n for r in g.roots for n in self.subtree(r)}
            small = {n for n in inlined if n.op in POINTWISE_OPS and self._amplified(n, domain)}
            for n in small:
                if (self._cost(n) >= 2 * 4 and any(m.op in TRANSCENDENTAL_OPS for m in (n, *self.subtree(n)))
                        and not self._has_reduction(n) and all(x.op in (Op.INPUT, Op.TENSOR) for x in self.reads(n))
                        and any(u not in small for u in self._readers_past_views(n))):
                    out.add(n)
        return out

    def _amplified(self, node: Node, domain: int) -> bool:
        size = sh.static(sh.numel(node.shape)) if node.shape is not None else None
        return bool(size) and domain >= self.cfg.max_broadcast_recompute * size

    def _readers_past_views(self, node: Node) -> list[Node]:
        """The nodes that read ``node``, through any views of it."""
        readers, stack = [], list(self.users.get(node, ()))
        while stack:
            u = stack.pop()
            if u.op in VIEW_OPS:
                stack.extend(self.users.get(u, ()))
            else:
                readers.append(u)
        return readers

    def _full_reads(self, node: Node) -> int:
        """Buffers of as many elements as ``node`` that a kernel recomputing it reads (a norm's
        weight or row statistics are not counted: they are small beside them)."""
        size = sh.numel(node.shape)
        return sum(1 for x in self.reads(node) if x.shape is not None and sh.equal(sh.numel(x.shape), size))

    def _cost(self, node: Node) -> int:
        total = 0
        for n in [node, *self.subtree(node)]:
            if n.op in POINTWISE_OPS:
                total += 4 if n.op in TRANSCENDENTAL_OPS else 1
        return total

    # ---- 4. build --------------------------------------------------------------------------
    def buffers(self) -> dict[Node, BufferInfo]:
        infos: dict[Node, BufferInfo] = {}
        count = 0
        wanted, prescribed = self._output_layouts()
        prescribed |= set(self.views.values())  # (views are replayed from a contiguous base: indexing.py)
        for node in self.graph.nodes:
            if node.op is Op.INPUT and node.arg.kind == "tensor":
                infos[node] = BufferInfo(node.arg.name, node.arg.strides)
            elif node.op is Op.TENSOR:
                infos[node] = BufferInfo(f"const_{node.arg.name}", sh.contiguous_strides(node.shape))
            elif node.shape is not None and (node in self.buffered or node.op in (Op.EXTERN, Op.GETITEM)):
                layout = wanted.get(node) if node.op not in (Op.EXTERN, Op.GETITEM) else aten_result_strides(node)
                if layout is None and node.op not in (Op.EXTERN, Op.GETITEM) and node not in prescribed:
                    # (read by ember's kernels only: in the order of what it is computed from)
                    layout = operand_order(node, lambda x: infos[x].strides if x in infos else None)
                infos[node] = BufferInfo(f"buf{count}", layout or sh.contiguous_strides(node.shape))
                count += 1
        return infos

    def _output_layouts(self) -> tuple[dict[Node, sh.Shape], set[Node]]:
        """Strides eager gives outputs, where they are not contiguous (a column of a matrix saved
        for backward): the graph reading the output was traced with them. Likewise for a kernel's
        result an ATen call reads: its result's layout may follow its input's (max_pool2d of a
        channels_last activation), and the graph after it was traced with eager's. Overlapping
        layouts (stride 0 on a dim longer than 1) are left contiguous: a kernel cannot store into
        them. Also the nodes whose layout eager prescribes, contiguous ones too."""
        wanted: dict[Node, sh.Shape] = {}
        pairs = list(zip(self.graph.outputs, self.graph.output_strides))
        for node in self.graph.nodes:
            if node.op is Op.EXTERN and node.arg.input_strides:
                pairs += [(x, st) for x, st in zip(node.inputs, node.arg.input_strides) if x in self.buffered]
        # outputs replayed as views of a buffer: the buffer laid out so that they come out with
        # eager's strides (a broadcast view of a transposed value, two columns of one)
        direct = {n for n, _ in pairs}
        for node, strides in zip(self.graph.outputs, self.graph.output_strides):
            base = self.views.get(node)
            if base is not None and strides is not None and base in self.buffered and base not in direct:
                layout = base_layout(node, base, strides)
                if layout is not None:
                    pairs.append((base, layout))
        for node, strides in pairs:
            if node is None or strides is None or node in wanted or len(strides) != node.rank:
                continue
            if any(sh.equal(st, 0) and not sh.is_one(size) for st, size in zip(strides, node.shape)):
                continue
            # (size-1 dims too: their strides move no element, but eager's come back as eager's, an
            # (n, c, 1, 1) channels_last pooling's (c, 1, c, c))
            if any(not sh.equal(a, b) for a, b in zip(strides, sh.contiguous_strides(node.shape))):
                # (a stride that may be negative, min(w, h - 5) of a diagonal past the matrix, is
                # one of an empty tensor: 0 is as good, and empty_strided takes no negative one)
                wanted[node] = tuple(st if sh.nonnegative(st) else sympy.Max(0, sh.expr(st)) for st in strides)
        return wanted, {node for node, strides in pairs if node is not None and strides is not None}

    def plan(self) -> Schedule:
        for attempt in range(10 * len(self.graph.nodes) + 10):
            self._replay_views()
            groups = self.form_groups()
            split = self.split_passes(groups)
            if split:
                self.buffered |= split
                continue
            extra = (self.costly_shared(groups) | self.costly_broadcast(groups)) - self.released
            if extra:
                self.buffered |= extra
                self.shared |= extra
                continue
            infos = self.buffers()
            try:
                kernels = [self._build(g, infos, i) for i, g in enumerate(groups)]
            except NeedsBuffer as e:
                if e.node in self.buffered and (not isinstance(e, AcrossFailed) or e.node in self.not_across):
                    # the next attempt would plan the same groups and fail the same way
                    raise RuntimeError(f"ember: fusion planning is stuck: {e.node} needs a buffer it already "
                                       "has") from e
                self.buffered.add(e.node)
                if isinstance(e, AcrossFailed):
                    self.not_across.add(e.node)
                continue
            except Conflict as e:
                self._separate(e, groups)
                continue
            local = self._local_shared(groups)
            if local:  # each at most once: a later NeedsBuffer or Conflict may buffer it again
                self.buffered -= local
                self.shared -= local
                self.released |= local
                continue
            schedule = self._schedule(groups, kernels, infos)
            schedule.attempts, schedule.reused = attempt + 1, self._reused
            return schedule
        raise RuntimeError("ember: fusion did not converge")  # a scheduler bug, not user error

    def _local_shared(self, groups: list[GroupSpec]) -> set[Node]:
        """Values buffered for sharing whose readers all ended up in their own kernel (the
        kernel computes them once anyway): their stores would be written and never read. Not
        those a view is replayed from since, or that another kernel reads: they need the buffer
        (an empty slice of a loss's value, returned, lost it and failed the graph to ATen with a
        KeyError)."""
        local: set[Node] = set()
        bases = set(self.views.values())
        read_by: dict[Node, set[int]] | None = None  # buffer -> the groups reading it (made on first use)
        for gi, g in enumerate(groups):
            computed = {n for r in g.roots for n in [r, *self.subtree(r)]}
            for n in g.roots:
                if (n in self.shared and n not in self.released and n not in bases
                        and all(u in computed for u in self.users[n])):
                    if read_by is None:
                        read_by = {}
                        for hi, h in enumerate(groups):
                            for r in h.roots:
                                for x in self.reads(r):
                                    read_by.setdefault(x, set()).add(hi)
                    # (another kernel inlining one of its users reads the buffer too: released,
                    # that kernel summed a softmax's row again, in another order, and the
                    # backward's x == max found no element equal to the max: NaN gradients)
                    if read_by.get(n, set()) <= {gi}:
                        local.add(n)
        return local

    def _separate(self, e: Conflict, groups: list[GroupSpec]) -> None:
        """Make the next plan differ where a kernel read one of its roots at another point: the
        roots reading it go to other kernels, or the reader gets a buffer of its own."""
        group = next(g for g in groups if e.root in g.roots)
        reader_roots = [r for r in group.roots if r is not e.root and (
            r is e.reader or e.reader in self.subtree(r)
            # read through views, with no pointwise reader between (a permuted copy of the root)
            or e.reader is e.root and e.root in self.reads(r))]
        pairs = {frozenset((r, e.root)) for r in reader_roots}
        if pairs - self.apart:
            self.apart |= pairs
        elif e.reader not in self.buffered:
            self.buffered.add(e.reader)  # the root reads itself shifted: split at the reader
        else:  # nothing left to change: fail now (the graph runs through ATen), not after 10N tries
            raise RuntimeError(f"ember: fusion did not converge: {e}")

    def _build(self, spec: GroupSpec, infos: dict[Node, BufferInfo], index: int) -> Kernel:
        """The group's kernel. Each attempt plans every group again, but a group whose spec,
        inlined nodes and buffers read are those of an earlier attempt gets that attempt's kernel:
        a graph of a hundred groups can take tens of attempts (each NeedsBuffer buffers one node)."""
        subtrees = [self.subtree(r) for r in spec.roots]
        earlier = self._built.setdefault(tuple(spec.roots), [])
        kernel = next((k for old_spec, old_subtrees, read, k in earlier if old_spec == spec and old_subtrees == subtrees
                       and all(infos.get(n) == i for n, i in read.items())), None)
        self._reused += kernel is not None
        if kernel is None:
            reads = RecordedReads(infos)
            kernel = self._build_kernel(spec, reads, subtrees)
            earlier.append((spec, subtrees, reads.read, kernel))
        kernel.name = self._kernel_name(kernel, index)
        return kernel

    def _build_kernel(self, spec: GroupSpec, infos: RecordedReads, subtrees: list[tuple[Node, ...]]) -> Kernel:
        kernel = KernelBuilder(spec, infos, "", self.held, self.converted, self.saved).build()  # type: ignore[arg-type]  # (lookups only)
        # (a matmul's tiles need its two dims: they are never collapsed into one)
        if not spec.matmul:  # (the C++ backend's only: a simd loop walks the last dim, a GPU thread a flat position)
            kernel = collapse_dims(memory_ordered_dims(kernel if self.gpu else simplify_with_ranges(kernel)))
            kernel = kernel if self.gpu else split_inner_by_divisor(kernel)
        kernel = guard_branches(kernel)
        # Every size the group's nodes mention is an argument, so the group can also run
        # through ATen (when its kernel fails to build) from the kernel's own arguments.
        nodes = {n for r, sub in zip(spec.roots, subtrees) for n in [r, *sub]}
        kernel.sizes = sorted(set(kernel.sizes) | _symbols(nodes), key=lambda s: s.name)
        read_totals_on_device(kernel, self.totals, infos)  # type: ignore[arg-type]
        return kernel

    @staticmethod
    def _kernel_name(kernel: Kernel, index: int) -> str:
        names: list[str] = []
        for origin in kernel.origins:
            short = origin.split(".")[-1].lstrip("_")
            if short not in names:
                names.append(short)
        return f"fused_{'_'.join(names[:6]) or 'copy'}_{index}"


def plan(graph: Graph, cfg: Config, gpu: bool = False, hints: dict[sympy.Symbol, int] | None = None) -> Schedule:
    """The kernels, buffers and steps of ``graph``; ``gpu``: for GPU kernels (Triton, CUDA C++);
    ``hints``: the example's values of symbolic sizes (only heuristics read them)."""
    return Planner(graph, cfg, gpu, hints).plan()
