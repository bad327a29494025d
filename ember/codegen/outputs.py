"""How a compiled graph's outputs come back: in the memory and with the strides eager gives them.

A mixin of wrapper.WrapperWriter (its attributes: the schedule ``s``, ``var``, ``view_base``,
``eager_layout``, ``symbols``, ``emit``). ember's IR has no clones, detaches or ``.contiguous()``
(each is its source), so the program itself copies, detaches or relayouts an output where eager
would hand the user memory or strides of its own, and copies a backward's input that arrives laid
out otherwise than traced.
"""

from __future__ import annotations

from ..ir import shapes as sh
from ..ir.node import ArgRef, Node
from ..ir.ops import VIEW_OPS, Op
from ..schedule.indexing import base_layout
from .pyexpr import replayed_chain, shape_tuple


class OutputLayouts:
    def _shared_outputs(self) -> list[int]:
        """Outputs eager returns in memory of their own (``Graph.fresh_outputs``) that would come
        back as an input, a constant, or memory another output already returns: a clone is its
        source in ember's IR, and CSE makes equal values one. Returned so, a user's in-place
        change of the result would change the input or the other output too.

        In a backward, every gradient over memory an earlier one returns is copied as well:
        AOTAutograd's backward may return a gradient and a view of it (a ``cat`` of an expanded
        parameter with another one, a ViT's class token beside its position embedding), which
        autograd keeps as two parameters' ``.grad``; an in-place update of each
        (``clip_grad_norm_``, accumulation) then changed the shared elements twice.

        A fresh output replayed as a broadcast of smaller memory (``torch.zeros(2, 3)`` beside
        ``torch.zeros(3, 2)``: one 0-d constant after CSE) is copied too: eager's has a stride per
        element, and an in-place change of the broadcast raises."""
        g = self.s.graph
        backward = g.name.startswith("backward")
        claimed: set[Node] = set()
        shared = []
        for i, node in enumerate(g.outputs):
            if node is None or i in g.scalar_outputs or i in self.input_views:
                continue
            base = self._memory_of(node)
            if (i in g.fresh_outputs and (base.op in (Op.INPUT, Op.TENSOR) or self._broadcast_here(i))
                    or (i in g.fresh_outputs or backward) and base in claimed):
                shared.append(i)
            claimed.add(base)
        return shared

    def _input_views(self) -> dict[int, tuple[str, str]]:
        """``Graph.input_views`` the program can replay: {output i: (the input's variable, output
        i as views of it)}, where output i was lowered as a chain of views of the input or of the
        value written into it. Returned as those views of the input (its memory holds the written
        value once the program writes it), the output has eager's strides and offset, which
        AOTAutograd rebuilds it with. The graph's output could have a fresh value's strides (a
        view of the written value, or a value passes folded the views into) or a copy's (a
        reshape that only the guarded sizes make a view)."""
        g = self.s.graph
        views = {}
        for i, (k, _, chain) in g.input_views.items():
            target = g.inputs[k]
            if chain is not None and g.outputs[i] is not None and target in self.var:
                views[i] = (self.var[target], replayed_chain(self.var[target], chain))
        return views

    def _one_copy_groups(self, fresh: list[int]) -> dict[int, list[int]]:
        """Outputs that eager returns in one memory of its own, where ember's IR made that memory
        an input's or a constant's (``Graph.fresh_views``: ``out = x.clone(); return out[1:],
        out``, a clone is its source): {the fresh output j: the outputs viewing its memory, j
        first}, each copied by ``_views_of_one_copy``."""
        g = self.s.graph
        groups: dict[int, list[int]] = {}
        for i, j in sorted(g.fresh_views.items()):
            if i in self.input_views or j in self.input_views:
                continue
            base = self._memory_of(g.outputs[j])
            if (j in fresh and base.op in (Op.INPUT, Op.TENSOR) and base in self.var
                    and all(_views(g.outputs[t], base) for t in (i, j))):
                groups.setdefault(j, [j]).append(i)
        for j, outs in list(groups.items()):
            # the output that is all of the memory leads, where it is returned after a view of it
            # (``c = x[..., ::2].contiguous(); return c.view(3, -1)[:, 1::3], c``): copied at
            # eager's strides, the others its views, not a copy of the whole input
            whole = next((t for t in outs if t in g.whole_outputs), None)
            if whole is not None and whole != j:
                del groups[j]
                groups[whole] = [whole, *(t for t in outs if t != whole)]
        return groups

    def _views_of_one_copy(self, groups: dict[int, list[int]], returned: list[str]) -> list[int]:
        """One copy of the input for each of ``_one_copy_groups``, and each output the same chain
        of views of it, so they share memory with each other and not with the input. Copied one
        by one, the view came back on its own and the clone as the input itself. The fresh
        outputs handled here."""
        g = self.s.graph
        for j, outs in groups.items():
            base = self._memory_of(g.outputs[j])
            name = f"shared{j}"
            strides = [self._own_strides(t) for t in outs]
            if j in g.whole_outputs and None not in strides and not _broadcasts_on_the_way(g.outputs[j], base):
                # (output j is all of eager's memory: a copy of it at eager's strides, and the others
                # eager's views of that copy. A copy of the input, viewed as ember's IR views it, had
                # other strides: a max_pool1d of kernel 1, a slice of the input, came back strided,
                # and AOTAutograd's .view(-1) of it, an output too, raised)
                self.emit(f"{name} = relayout({returned[j]}, {shape_tuple(strides[0])})  # outputs "
                          f"{', '.join(map(str, outs))} view one memory of their own, as eager returns them")
                for t, st in zip(outs[1:], strides[1:]):
                    if _views(g.outputs[t], g.outputs[j]):  # (its views in ember's IR too: replayed)
                        returned[t] = self._replayed(name, g.outputs[t], g.outputs[j])
                    else:
                        returned[t] = f"view_in({name}, {returned[j]}, {returned[t]}, {shape_tuple(st)})"
                returned[j] = name
                continue
            # (where eager's memory is an expanded value, ``x.view(-1, 1).repeat(1, 3)``, that value
            # dense: a copy of the input, viewed as ember's IR views it, came back broadcast)
            memory = _expanded_memory([g.outputs[t] for t in outs], base)
            copied = (f"{self.var[base]}.clone()" if memory is base else
                      f"{self._replayed(self.var[base], memory, base)}.clone(memory_format=torch.contiguous_format)")
            self.emit(f"{name} = {copied}  # outputs {', '.join(map(str, outs))} view one memory of their own, "
                      "as eager returns them")
            for t in outs:
                returned[t] = self._replayed(name, g.outputs[t], memory)
        return list(groups)

    def _bases_over_copies(self, returned: list[str], copied: list[int]) -> None:
        """Outputs that eager returns in the memory of an output copied above, and that output a
        reshape of them (a training graph returns ``clone``, the intermediate base AOTAutograd
        rebuilds ``clone.view(-1)`` and its slices from, beside those: ``repeat_interleave``):
        that reshape of the copy back, so that they share its memory. ember's IR, where a clone
        is its source, had the base as a broadcast view of the input, which AOTAutograd's
        ``view`` refused. Where output j is no reshape of such a base that came back as a view of
        the input (a slice of it), the base is copied at eager's strides and output j replayed
        from the copy."""
        g = self.s.graph
        for i, j in sorted(g.fresh_views.items()):
            node, whole = g.outputs[i], g.outputs[j]
            if node is None or whole is None or i in copied or i in self.input_views:
                continue
            # (or output j is a kernel's result and output i a view of the input: the clone a
            # training graph returns beside ``clone.view(...)`` came back strided, and
            # AOTAutograd's view of it raised)
            apart = j in copied or self._memory_of(whole) is not self._memory_of(node)
            if apart and node.shape is not None and whole is not node and _reshapes(whole, node):
                self.emit(f"out{i} = {returned[j]}.reshape({shape_tuple(node.shape)})  # the memory "
                          f"of output {j}, as eager's")
                returned[i] = f"out{i}"
            elif (apart and i in g.whole_outputs and self._memory_of(node).op in (Op.INPUT, Op.TENSOR)
                  and (strides := self._own_strides(i)) is not None):
                # all of eager's fresh memory, here a view of the input at other strides: AOTAutograd
                # rebuilt a view output from it by its traced strides (``c.view(n, -1)[:, 1::3]``
                # of a strided ``c``) and read the wrong elements. A copy at eager's strides
                self.emit(f"out{i} = relayout({returned[i]}, {shape_tuple(strides)})  # memory of its own, "
                          "as eager's")
                returned[i] = f"out{i}"
                if _views(whole, node):  # (and output j its view, at eager's offset: AOTAutograd
                    # rebuilds views from the base by the offset the program returns them with)
                    returned[j] = self._replayed(returned[i], whole, node)

    def _own_strides(self, i: int) -> sh.Shape | None:
        """The strides eager returns output ``i`` with, where the program can spell them and they
        broadcast nothing (a copy of its own has a stride per element)."""
        node, strides = self.s.graph.outputs[i], self.s.graph.output_strides[i]
        if (strides is not None and sh.free_symbols(strides) <= set(self.symbols)
                and not any(sh.equal(st, 0) and not sh.is_one(n) for st, n in zip(strides, node.shape))):
            return strides
        return None

    def _broadcast_here(self, i: int) -> bool:
        """Is output ``i`` a broadcast view where eager's has a stride per element?"""
        g = self.s.graph
        node, strides = g.outputs[i], g.output_strides[i] if i < len(g.output_strides) else None
        if strides is None or len(strides) != node.rank or not _broadcasts(node):
            return False
        return not any(sh.equal(st, 0) and not sh.is_one(n) for st, n in zip(strides, node.shape))

    def _memory_of(self, node: Node) -> Node:
        """The node whose memory ``node`` comes back in: through replayed views, and through ATen
        calls that return a view of an argument (``x.clone().diagonal()`` is diagonal of ``x``
        in ember's IR, where a clone is its source). Each result of an ATen call returning
        several is memory of its own, unless they view an argument (``unbind``): a convolution's
        input gradient was copied as if it shared the weight gradient's memory."""
        while True:
            if node in self.view_base:
                node = self.view_base[node]
            elif (node.op is Op.GETITEM and node.inputs and node.inputs[0].op is Op.EXTERN
                  and _aliased_input(node.inputs[0]) is not None):
                node = node.inputs[0]
            elif node.op is Op.EXTERN and (aliased := _aliased_input(node)) is not None:
                node = aliased
            else:
                return node

    def _repeated_over_copies(self, returned: list[str], fresh: list[int]) -> list[int]:
        """Outputs that are an earlier output copied above, returned again (``Graph.repeated_outputs``:
        ``y = w.clone()`` both returned and saved for the backward, where ember's IR made ``y``
        the input ``w``): detached from that copy, with which they share memory and version
        counter. Returned as ``w``, the saved tensor was not the user's ``y``, so autograd never saw
        ``y.add_(1)`` change it, where eager's backward raises. No copy more: the user's is saved.
        The outputs handled here."""
        done = []
        for i, j in sorted(self.s.graph.repeated_outputs.items()):
            if j in fresh:
                self.emit(f"out{i} = {returned[j]}.detach()  # the copy output {j} returns, saved too")
                returned[i] = f"out{i}"
                done.append(i)
        return done

    def _distinct_outputs(self, returned: list[str], fresh: list[int]) -> None:
        """Outputs that come back as a view the wrapper made, or as a variable an earlier output
        returns (``y`` and ``y.detach()``: a detach is its source in ember's IR), are returned
        detached: tensors of their own over the same memory, with no view relation, as the
        graph's outputs are in eager (views of the graph's own results reach the user rebuilt by
        AOTAutograd from their base, whatever the graph returned). One object returned twice
        would share what autograd marks on it (the detached output's "no gradient" reached the
        other output, and a view rebuilt from it lost its gradient), and a view made under the
        compiled function's no_grad carries that mode: changing it in place raises."""
        seen: set[str] = set()
        for i, (node, var) in enumerate(zip(self.s.graph.outputs, returned)):
            if node is None or i in self.s.graph.scalar_outputs or i in fresh:
                continue
            if node.op is Op.INPUT:
                # an input returned (as an output and as a tensor saved for the backward): the
                # object itself, which AOTAutograd relates to the caller's (a nested tensor's
                # offsets carry the nested size its gradient must have)
                seen.add(var)
                continue
            if var not in seen and (i in self.input_views or node in self.view_base
                                    and self._memory_of(node).op is Op.INPUT):
                # a view of an input stays one: AOTAutograd rebuilds it from the input, or (views
                # that unbind or split an input requiring grad) hands it to the user as it is,
                # and autograd must see the view to refuse in-place changes to it, as eager does
                seen.add(var)
                continue
            if var in seen or node in self.view_base:
                name = f"out{i}"
                self.emit(f"{name} = {var}.detach()  # the same memory, a tensor of its own")
                returned[i] = name
            seen.add(var)

    def _traced_layouts(self, fresh: list[int]) -> dict[Node, tuple[list[int], sh.Shape | None]]:
        """Outputs in the memory of an ATen result come back with the strides they were traced
        with: ATen lays its result out as it does (a convolution's follows its input), and a
        clone or ``.contiguous()`` of it, which would have changed that, is no op in ember's IR.
        Copied at run time only where the layouts differ (``as_traced``). Several outputs over
        one result (``y = conv(x).contiguous()``; ``y, y[:, 0]``) get one copy, laid out so that
        each has eager's strides, and are replayed from it: they share memory as in eager.
        Overlapping layouts (a broadcast view of the result) stay as replayed.

        A view of a kernel's buffer that eager returns in memory of its own (``torch.diag(x + 1)``,
        ``[t.contiguous() for t in (x + 1).split(4, 1)]``: the clone is no op in ember's IR) is
        handled so too, where the buffer could not be laid out to give it eager's strides.

        {ATen result: (the outputs over it, the layout they are replayed from, or None: each
        output on its own)}."""
        g = self.s.graph
        over: dict[Node, list[int]] = {}
        for i, node in enumerate(g.outputs):
            strides = g.output_strides[i] if i < len(g.output_strides) else None
            if (node is None or i in g.scalar_outputs or i in fresh or i in self.input_views or strides is None
                    or node.shape is None
                    or len(strides) != node.rank
                    or not sh.free_symbols(strides) <= set(self.symbols)
                    or any(sh.equal(st, 0) and not sh.is_one(n) for st, n in zip(strides, node.shape))):
                continue
            base = self._memory_of(node)
            if base.op in (Op.EXTERN, Op.GETITEM):
                over.setdefault(base, []).append(i)
            elif i in g.fresh_outputs and base is not node:
                over.setdefault(node, []).append(i)  # (on its own: no other output shares its memory)
        return {base: (outs, self._one_layout(base, outs) if len(outs) > 1 else None) for base, outs in over.items()}

    def _as_traced(self, traced: dict[Node, tuple[list[int], sh.Shape | None]], returned: list[str]) -> None:
        g = self.s.graph
        for base, (outs, layout) in traced.items():
            if layout is not None:
                name = f"{self.var[base]}_traced"
                self.emit(f"{name} = as_traced({self.eager_layout.get(base, self.var[base])}, {shape_tuple(layout)})"
                          "  # eager's layout, for the outputs over it")
                for i in outs:
                    returned[i] = self._replayed(name, g.outputs[i], base)
                continue
            for i in outs:
                own = i in g.whole_outputs and self._alone_in_a_larger_buffer(i)
                self.emit(f"out{i} = {'as_own' if own else 'as_traced'}({returned[i]}, "
                          f"{shape_tuple(g.output_strides[i])})  # eager's layout{' and memory' if own else ''}")
                returned[i] = f"out{i}"

    def _alone_in_a_larger_buffer(self, i: int) -> bool:
        """Is output ``i`` a view of a larger buffer (an ATen result, a kernel's) that no output
        views where eager's views it (``y, y[0]``)? Eager returning it in memory of its own, it
        is copied (``as_own``), not to keep that buffer alive with it; where eager's outputs
        share its memory, they keep sharing the buffer."""
        g = self.s.graph
        memory = self._memory_of(g.outputs[i])
        return memory is not g.outputs[i] and not any(
            j != i and o is not None and j not in g.scalar_outputs and j not in g.whole_outputs
            and self._memory_of(o) is memory for j, o in enumerate(g.outputs))

    def _one_layout(self, base: Node, outs: list[int]) -> sh.Shape | None:
        """The layout of ``base`` giving every output in ``outs`` (``base`` itself, or views
        replayed from it) eager's strides; None where they want different ones."""
        g = self.s.graph
        layouts = set()
        for i in outs:
            node, strides = g.outputs[i], g.output_strides[i]
            if node is not base and self.view_base.get(node) is not base:
                return None
            layouts.add(tuple(strides) if node is base else base_layout(node, base, strides))
        return layouts.pop() if len(layouts) == 1 and None not in layouts else None

    def _fresh_copy(self, i: int, var: str) -> str:
        """Output ``i`` copied into memory of its own, laid out as eager returns it."""
        name = f"out{i}"
        if (strides := self._own_strides(i)) is not None:
            self.emit(f"{name} = relayout({var}, {shape_tuple(strides)})  # a copy of its own, as eager returns it")
        else:
            self.emit(f"{name} = {var}.clone(memory_format=torch.contiguous_format)  # a copy of its own")
        return name

    def _check_layouts(self) -> None:
        """A backward's inputs are the forward's saved tensors and the gradients autograd passes,
        with no guard on their strides, and its kernels read them with the strides it was traced
        with. Where a tensor comes in laid out otherwise, it is copied into that layout first:
        read in another layout its values would be silently wrong. (Dims of size 1 may have any
        stride; overlapping layouts are read correctly from any copy of their values.)"""
        for node in self.s.graph.inputs:
            spec = node.arg
            if spec.kind != "tensor" or spec.name not in self.kernel_reads or spec.strides is None:
                continue
            dims = [i for i, size in enumerate(node.shape) if not sh.is_one(size)]
            if any(sh.equal(spec.strides[i], 0) for i in dims) or not dims:
                continue
            if len(dims) == node.rank:
                got, want = f"{spec.name}.stride()", shape_tuple(spec.strides)
            else:
                got = "(" + ", ".join(f"{spec.name}.stride({i})" for i in dims) + ("," if len(dims) == 1 else "") + ")"
                want = shape_tuple(tuple(spec.strides[i] for i in dims))
            self.emit(f"if {got} != {want}:  # laid out otherwise than traced: copied into that layout")
            self.emit(f"{spec.name} = relayout({spec.name}, {shape_tuple(spec.strides)})", depth=2)


def _aliased_input(node: Node) -> Node | None:
    """The input an ATen call returns a view of, without writing it (diagonal, unfold,
    as_strided, a dtype view, unbind): its schema's return shares an argument's alias set."""
    schema = getattr(node.arg.target, "_schema", None)
    returned = schema.returns[0].alias_info if schema is not None and schema.returns else None
    if returned is None or returned.is_write:
        return None
    for j, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and not argument.alias_info.is_write:
            value = node.arg.args[j] if j < len(node.arg.args) else node.arg.kwargs.get(argument.name)
            return node.inputs[value.index] if isinstance(value, ArgRef) else None
    return None


def _broadcasts(node: Node) -> bool:
    """Is ``node`` a view that broadcasts its memory: an expand of a dim of 1, or with new
    leading dims, to more than one element?"""
    while node.op in VIEW_OPS:
        x = node.inputs[0]
        if node.op is Op.EXPAND:
            lead = node.rank - x.rank  # (new leading dims, then x's)
            old = (1,) * lead + tuple(x.shape)
            if any(sh.is_one(a) and not sh.is_one(b) for a, b in zip(old, node.shape)):
                return True
        node = x
    return False


def _views(node: Node, base: Node, ops: frozenset[Op] = VIEW_OPS) -> bool:
    """Is ``node`` ``base`` or a chain of views of it (``WrapperWriter._replayed`` replays it),
    each one of ``ops``?"""
    while node is not base:
        if node.op not in ops or not node.inputs:
            return False
        node = node.inputs[0]
    return True


def _reshapes(node: Node, base: Node) -> bool:
    """Is ``node`` ``base`` or a chain of reshapes of it?"""
    return _views(node, base, frozenset({Op.RESHAPE}))


def _expanded_memory(outs: list[Node], base: Node) -> Node:
    """The view of ``base`` that the chains of views from it to each of ``outs`` share last, where
    every expand on those chains comes before it (eager's memory, when the expand is a
    ``repeat`` or an expanded clone); ``base`` where the chains expand nothing or part apart
    before their last expand."""
    chains = []
    for node in outs:
        chain = [node]
        while chain[-1] is not base:
            chain.append(chain[-1].inputs[0])
        chains.append(chain[::-1])  # (base first)
    common = 0
    while all(len(c) > common and c[common] is chains[0][common] for c in chains):
        common += 1
    shared = chains[0][:common]
    if not any(n.op is Op.EXPAND for n in shared) or any(n.op is Op.EXPAND for c in chains for n in c[common:]):
        return base
    return shared[-1]


def _broadcasts_on_the_way(node: Node, base: Node) -> bool:
    """Does the chain of views from ``base`` to ``node`` expand? (Then its elements' offsets do not
    say which element of ``node`` they are: ``runtime.program.view_in`` needs them to.)"""
    while node is not base:
        if node.op is Op.EXPAND:
            return True
        node = node.inputs[0]
    return False
