"""The host-side program of a compiled graph, generated as readable Python.

    def call(args):
        arg0_1, arg1_1 = args
        args.clear()
        s0 = arg0_1.size(0)
        buf0 = advise_huge(empty_cpu((s0, 4096), (4096, 1), torch.float32))
        fused_relu_add_0(arg0_1.data_ptr(), arg1_1.data_ptr(), buf0.data_ptr(), s0)
        return (buf0,)

It binds size symbols from the inputs, allocates each kernel's outputs just before the kernel,
calls kernels and ATen ops in dependency order, and drops buffers after their last use. A kernel
output of the same size, dtype and layout as a buffer that dies in that kernel is written over it
(``schedule/inplace.py`` says when that is safe): the buffer is one of ember's own, a matmul's
result, or a backward's saved tensor that nothing else can see (``InputSpec.donated``; reused
only when autograd will not run the backward again, ``retain_graph=False``), and nothing views it
(a replayed view, or an ATen call whose result may alias its input, as ``aten.diagonal``'s does).

Kernels that take raw addresses get each memory's ``data_ptr()`` once between ATen calls: where a
later argument (an output stored in place, ``buf0 = arg0_1``, or a later kernel's input) is the
same memory, the first read keeps it in a local, ``(arg0_1_p := arg0_1.data_ptr())``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ..ir import dtypes as dt
from ..ir import shapes as sh
from ..ir.node import ArgRef, Node, aten_result_strides, is_plus_zero, op_name, view_chain
from ..ir.ops import VIEW_OPS, Op
from ..ir.strides import compose_strided
from ..schedule.device_sizes import DEVICE_TOTALS
from ..schedule.inplace import writes_in_place
from ..schedule.steps import ExternStep, KernelStep, Schedule, ViewStep
from .input_writes import InputWrites
from .outputs import OutputLayouts
from .pyexpr import WrapperError, pexpr, replayed_chain, shape_tuple

# ATen calls whose result is always a new tensor: their buffers may be written over
_FRESH_EXTERNS = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "_int_mm"})


def _may_return_a_view(node: Node) -> bool:
    """May this ATen call's result share memory with one of its inputs (its schema's alias
    annotations: ``diagonal(Tensor(a) self) -> Tensor(a)``)? Targets without a schema may."""
    schema = getattr(node.arg.target, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


@dataclass
class KernelCall:
    """How the program calls one kernel: its Python name, whether it takes tensors or raw
    pointers, and whether it reports errors through the error flag."""
    name: str
    uses_error_flag: bool = False
    fallback: bool = False      # its build failed: an ATen implementation with the same arguments
    pass_tensors: bool = False  # tensors (Triton, ATen fallbacks) rather than data_ptr() ints
    why_aten: str = "failed to build"  # why a fallback runs (explain's render-only targets)


@dataclass
class Wrapper:
    source: str
    constants: dict[str, Any] = field(default_factory=dict)


class WrapperWriter(OutputLayouts, InputWrites):
    def __init__(self, schedule: Schedule, calls: dict[str, KernelCall], timed: bool = False,
                 huge_page_bytes: int = 0):
        self.s = schedule
        self.calls = calls
        self.timed = timed
        self.huge_page_bytes = huge_page_bytes
        self.lines: list[str] = []
        self.constants: dict[str, Any] = {}
        self.var: dict[Node, str] = {}
        for node, info in schedule.buffers.items():
            self.var[node] = info.name if node.op is not Op.TENSOR else self._const(node.arg.value, info.name)
        # buffers some kernel reads: ATen results among them must be dense
        self.kernel_reads = {p.name for k in schedule.kernels for p in k.params if not p.is_output}
        self.node_of = {info.name: node for node, info in schedule.buffers.items()}
        # buffers something views: their memory outlives their last direct read (an ATen call's
        # result may be a view too: ``aten.diagonal`` of a buffer a later kernel would overwrite)
        self.viewed = {schedule.buffers[s.base].name for s in schedule.steps if isinstance(s, ViewStep)}
        self.viewed |= {schedule.buffers[x].name for s in schedule.steps
                        if isinstance(s, ExternStep) and _may_return_a_view(s.node)
                        for x in s.node.inputs if x in schedule.buffers}
        self.view_base = {s.node: s.base for s in schedule.steps if isinstance(s, ViewStep)}  # replayed views
        # data_ptr() read once: a variable's pointer local (``arg0_1_p``), valid while only kernel
        # calls and their buffers' lines run (an ATen call or anything else forgets them all), and
        # the variables that hold another's memory (an output stored in place: ``buf0 = arg0_1``)
        self.pointers: dict[str, str] = {}
        self.same_memory: dict[str, str] = {}
        self.last_kernel_read = {p.name: j for j, s in enumerate(schedule.steps) if isinstance(s, KernelStep)
                                 for p in s.kernel.params}  # the last kernel step passing each buffer

    def _const(self, value: Any, hint: str = "c") -> str:
        name = hint if hint not in self.constants else f"{hint}_{len(self.constants)}"
        self.constants[name] = value
        return name

    def emit(self, line: str, depth: int = 1, keeps_pointers: bool = False) -> None:
        if not keeps_pointers:
            self.pointers.clear()
        self.lines.append("    " * depth + line)

    # ---- sizes ----------------------------------------------------------------------------
    def bind_sizes(self) -> None:
        needed = set()
        for node in self.s.graph.nodes:
            for e in (node.shape or ()):
                needed |= sh.expr(e).free_symbols
        for k in self.s.kernels:
            needed |= set(k.sizes)
        # the strides kernel outputs are allocated with, eager's: a size-1 dim keeps an input's
        # stride there (y.float() of a (1, n) row of a larger tensor's storage), a symbol no
        # shape and no kernel needs
        for step in self.s.steps:
            if isinstance(step, KernelStep):
                for root in step.roots:
                    for e in (self.s.buffers[root].strides or ()):
                        needed |= sh.expr(e).free_symbols
        for o in self.s.graph.outputs:
            if o is not None and o.op is Op.CONST and isinstance(o.arg, sympy.Basic):
                needed |= o.arg.free_symbols
        for node in self.s.graph.nodes:
            if node.op is Op.EXTERN:
                needed |= _template_symbols(node.arg.args) | _template_symbols(node.arg.kwargs)
            if node.op is Op.CONST and isinstance(node.arg, sympy.Basic):
                needed |= node.arg.free_symbols
        for step in self.s.steps:  # the starts of a replayed view's slices (x[i] at a symbolic i)
            if isinstance(step, ViewStep):
                n = step.node
                while n is not step.base:
                    needed |= _template_symbols(n.arg)
                    n = n.inputs[0]
        bound: dict[sympy.Symbol, str | None] = {}
        passed: set[sympy.Symbol] = set()  # (the ints the caller passes: a Python int of any size)
        for node in self.s.graph.inputs:
            spec = node.arg
            if spec.kind == "symint" and spec.expr is not None and spec.expr.is_Symbol:
                bound.setdefault(spec.expr, spec.name)
                if bound[spec.expr] == spec.name and not sh.is_float_symbol(spec.expr):
                    passed.add(spec.expr)
        for node in self.s.graph.inputs:
            spec = node.arg
            if spec.kind != "tensor":
                continue
            if spec.item is not None:
                bound.setdefault(spec.item, None if spec.to_device else f"{spec.name}.item()")
            for i, e in enumerate(node.shape):
                if e.is_Symbol:
                    bound.setdefault(e, f"{spec.name}.size({i})")
            for i, e in enumerate(spec.strides or ()):
                if e.is_Symbol:
                    bound.setdefault(e, f"{spec.name}.stride({i})")
        for node in self.s.graph.inputs:
            # then sizes an input holds only shifted: a batch size B from offsets of B + 1 (in a
            # backward whose other inputs have T rows)
            if node.arg.kind == "tensor":
                for i, e in enumerate(node.shape):
                    shifted = _shifted_symbol(e)
                    if shifted is not None:
                        sym, c = shifted
                        bound.setdefault(sym, f"{node.arg.name}.size({i}) {'-' if c > 0 else '+'} {abs(c)}")
        # 1 inside an ember.cuda_graph step, where kernels read ragged totals on the device
        bound[DEVICE_TOTALS] = "in_graphed_step()"
        # sizes only an ATen result knows (unbacked: nonzero's count, a mixture of experts'
        # tokens per expert) are read from it once it exists
        self.bind_after: dict[Node, list[tuple[sympy.Symbol, str]]] = {}
        for node in self.s.graph.nodes:
            if node.op is Op.EXTERN and node.arg.binds is not None:  # .item(): bound by its call
                bound.setdefault(node.arg.binds, None)
            if node.op in (Op.EXTERN, Op.GETITEM) and node.shape is not None and node in self.var:
                for i, e in enumerate(node.shape):
                    if e.is_Symbol and e in needed and e not in bound:
                        bound[e] = None
                        self.bind_after.setdefault(node, []).append((e, f"{self.var[node]}.size({i})"))
        missing = sorted(str(s) for s in needed - set(bound))
        if missing:
            raise WrapperError(f"cannot bind size symbol(s) {missing} from the inputs")
        # eager's checks of sizes, each made once its sizes are known (a check of sizes no input
        # carries, nor any result, cannot be made: nothing computed reads them either). Not the
        # warnings of a backward: a var it recomputes warned in the forward, as eager's only does
        backward = self.s.graph.name.startswith("backward")
        self.pending_checks = [c for c in self.s.graph.size_checks
                               if c.value.free_symbols <= set(bound) and not (c.warn and backward)]
        for check in self.pending_checks:
            needed |= check.value.free_symbols
        self.symbols = sorted(needed, key=lambda s: s.name)
        self.known_symbols = {sym for sym in self.symbols if bound[sym] is not None}
        for sym in self.symbols:
            if bound[sym] is not None:
                self.emit(f"{sym.name} = {bound[sym]}")
                if sym in passed:
                    # kernels take int64 (ctypes wraps any other int silently); eager's conversion
                    # of the int to a Scalar raises
                    self.emit(f"if not {-2**63} <= {sym.name} < {2**64}:")
                    self.emit(f"    raise OverflowError(\"can't convert negative int to unsigned\" if {sym.name} < 0 "
                              "else 'int too big to convert')")
        self._emit_size_checks()

    def _emit_size_checks(self) -> None:
        """Eager's errors of sizes (Graph.size_checks) whose sizes are all known by now."""
        for check in [c for c in self.pending_checks if c.value.free_symbols <= self.known_symbols]:
            self.pending_checks.remove(check)
            value = sympy.sympify(check.value)
            if value.is_Integer and check.low <= int(value) <= check.high:
                continue  # (static sizes that pass)
            act = f"warnings.warn({check.message!r}, {check.error})" if check.warn else (
                f"raise {check.error}({check.message!r})")
            if value.is_Integer:
                self.emit(act)
            else:
                self.emit(f"if not {check.low} <= {pexpr(value)} <= {check.high}:")
                self.emit(act, depth=2)

    # ---- steps ----------------------------------------------------------------------------
    def write(self) -> Wrapper:
        g = self.s.graph
        self.lines = ["def call(args):"]
        names = [n.arg.name for n in g.inputs]
        if names:
            self.emit(", ".join(names) + ("," if len(names) == 1 else "") + " = args")
        self.emit("args.clear()  # inputs die as soon as nothing needs them")
        self._keep_given_inputs()
        if any(call.uses_error_flag for call in self.calls.values()):
            self.emit("error_flag = thread_error_flag()  # where kernels flag a bad index (one per thread)")
        for node in g.inputs:
            if node.arg.kind == "tensor" and node.arg.to_device:
                if node.arg.item is not None:  # (read while on the host: no sync)
                    self.emit(f"{node.arg.item.name} = {node.arg.name}.item()")
                self.emit(f"{node.arg.name} = {node.arg.name}.to({node.arg.to_device!r}, non_blocking=True)"
                          "  # a 0-d CPU tensor used as a scalar")
        self.bind_sizes()
        if g.name.startswith("backward"):
            self._check_layouts()
        last_use = self.last_use = self._last_uses()
        outputs = self.outputs = {o for o in g.outputs if o is not None}
        self.output_vars = self._output_vars(outputs)
        self._plan_input_writes()
        self.input_views = self._input_views()
        self.output_vars |= {name for name, _ in self.input_views.values()}
        fresh = self._shared_outputs()
        one_copy = self._one_copy_groups(fresh)
        # (an input copied for outputs that all view it, none the input itself: alive until then)
        self.output_vars |= {self.var[self._memory_of(g.outputs[j])] for j in one_copy}
        traced = self._traced_layouts(fresh)
        # (an ATen result whose outputs are replayed from a copy of it: alive until then)
        self.output_vars |= {self.var[base] for base, (_, layout) in traced.items() if layout is not None}
        # ATen results that kernels read densely, where the graph also returns them or a view of
        # them: the variable holding the result as ATen laid it out
        self.eager_layout: dict[Node, str] = {}
        self.viewed_for_outputs = {s.base for s in self.s.steps if isinstance(s, ViewStep) and s.node in outputs}
        for i, step in enumerate(self.s.steps):
            if isinstance(step, KernelStep):
                self._kernel(step, i)
            elif isinstance(step, ExternStep):
                self._extern(step)
            else:
                self._view(step)
            dead = [v for v, last in last_use.items() if last == i and v not in self.output_vars]
            if dead:
                self.emit("del " + ", ".join(sorted(dead)), keeps_pointers=True)
        returned = [self._output(i, o) for i, o in enumerate(g.outputs)]
        shared = self._views_of_one_copy(one_copy, returned)
        for i in fresh:
            if i not in shared:
                returned[i] = self._fresh_copy(i, returned[i])
        self._bases_over_copies(returned, [i for i in fresh if i not in shared])
        self._as_traced(traced, returned)
        for i, (_, view) in self.input_views.items():
            self.emit(f"out{i} = {view}  # eager's view of the input")
            returned[i] = f"out{i}"
        repeated = self._repeated_over_copies(returned, fresh)
        self._distinct_outputs(returned, fresh + repeated)
        returned = self._write_inputs(returned)
        self.emit("return (" + "".join(r + ", " for r in returned) + ")")
        return Wrapper("\n".join(self.lines) + "\n", self.constants)

    def _output_vars(self, outputs: set[Node]) -> set[str]:
        return {self.var[o] for o in outputs if o in self.var}

    def _output(self, i: int, node: Node | None) -> str:
        if node is None:
            return "None"
        if i in self.s.graph.scalar_outputs:
            value = node.arg
            return pexpr(value) if isinstance(value, sympy.Basic) else repr(value)
        return self.eager_layout.get(node, self.var[node])

    def _reads(self, step: Any) -> list[str]:
        if isinstance(step, KernelStep):
            bufs = {p.name for p in step.kernel.params if not p.is_output}
            # a write at indices into a view (``cache[1][:, :, pos] = k``) copies the view, which
            # has no variable until its step runs: until then it is its base's memory
            copied = {self.var[x if x in self.var else self.view_base[x]] for x in step.fills.values()
                      if isinstance(x, Node)}
            return sorted({v for n, v in self.var.items() if v in bufs} | copied)
        if isinstance(step, ExternStep):
            return [self.var[x] for x in step.node.inputs if x in self.var]
        return [self.var[step.base]]

    def _last_uses(self) -> dict[str, int]:
        """The step after which each buffer, and each input, is read no more. Inputs too: a
        backward's saved activations are dropped by autograd when it calls the backward (the
        inputs list is cleared), so deleting them here frees their memory for what comes next."""
        last: dict[str, int] = {}
        for i, step in enumerate(self.s.steps):
            for v in self._reads(step):
                if not v.startswith("const_"):
                    last[v] = i
        return last

    def _kernel(self, step: KernelStep, i: int) -> None:
        k = step.kernel
        call = self.calls[k.name]
        into = self._into_inputs(step, i)
        reuse = self._reuse(step, i)
        for root in step.roots:
            if root in into:
                self.emit(f"{self.var[root]} = {self.var[into[root]]}  # the new value of {self.var[into[root]]}, "
                          "stored in place", keeps_pointers=True)
                self.same_memory[self.var[root]] = self._memory_var(self.var[into[root]])
            elif root in reuse:
                self.emit(self._write_over(root, reuse[root]), keeps_pointers=True)
            else:
                self.emit(self._allocate(root), keeps_pointers=True)
            if root in step.fills and not (root in into and step.fills[root] is into[root]):
                # a write at indices starts from the tensor written into (unless it is that tensor)
                source = step.fills[root]
                if not isinstance(source, Node):
                    value = repr(source) if not isinstance(source, float) or math.isfinite(source) else (
                        f"float({str(source)!r})")
                    self.emit(f"{self.var[root]}.zero_()" if is_plus_zero(source)
                              else f"{self.var[root]}.fill_({value})", keeps_pointers=True)
                else:
                    self.emit(f"{self.var[root]}.copy_({self.var[source]})", keeps_pointers=True)
        if call.fallback:
            self.emit(f"# {k.name} {call.why_aten}: its ops run through ATen")
        tensors = call.pass_tensors or call.fallback
        args = [p.name for p in k.params] if tensors else self._pointer_args(step, i)
        args += [s.name for s in k.sizes]
        if call.uses_error_flag:
            args.append("error_flag")
        line = f"{call.name}({', '.join(args)})"
        if self.timed:
            line = f"timed({call.name!r}, lambda: {line})"
        self.emit(line, keeps_pointers=not tensors)
        if call.uses_error_flag:
            self.emit("check_error_flag(error_flag)", keeps_pointers=True)

    def _memory_var(self, name: str) -> str:
        return self.same_memory.get(name, name)

    def _pointer_args(self, step: KernelStep, i: int) -> list[str]:
        """A kernel's tensor arguments as addresses: ``x.data_ptr()``, kept in a local
        (``x_p := x.data_ptr()``) where this call or a later kernel's passes the same memory again
        (an Adam step's in-place outputs, read by the next kernel: 520 data_ptr() calls a step for
        208 tensors before)."""
        last = self.last_kernel_read
        params = [p.name for p in step.kernel.params]
        memories = [self._memory_var(name) for name in params]  # (the cache's keys)
        args = []
        for n, (name, memory) in enumerate(zip(params, memories)):
            if memory in self.pointers:
                args.append(self.pointers[memory])
            elif not self.timed and (memory in memories[n + 1:] or last.get(memory, -1) > i or last.get(name, -1) > i):
                # (read through this call's own name: the variable first holding the memory may
                # have been deleted already)
                self.pointers[memory] = f"{memory}_p"
                args.append(f"({memory}_p := {name}.data_ptr())")
            else:
                args.append(f"{name}.data_ptr()")
        return args

    def _reuse(self, step: KernelStep, i: int) -> dict[Node, Node]:
        """Outputs of this kernel that it may write over an input dying in it (see the module
        docstring): {output root: the input's node}."""
        out: dict[Node, Node] = {}
        taken: set[str] = set()
        for root in step.roots:
            if root in step.fills:
                continue
            info = self.s.buffers[root]
            for p in step.kernel.params:
                name = p.name
                node = self.node_of.get(name)
                if (p.is_output or name in taken or node is None or self.last_use.get(name) != i
                        or name in self.output_vars or name in self.viewed or not self._reusable(node)):
                    continue
                if (node.dtype != root.dtype or node.device != root.device or tuple(node.shape) != tuple(root.shape)
                        or tuple(self.s.buffers[node].strides or ()) != tuple(info.strides or ())):
                    continue
                if writes_in_place(step.kernel, name, info.name):
                    out[root] = node
                    taken.add(name)
                    break
        return out

    @staticmethod
    def _reusable(node: Node) -> bool:
        """Is this buffer's memory the program's to overwrite once it is read for the last time?"""
        if node.op is Op.INPUT:
            return node.arg.kind == "tensor" and node.arg.donated
        if node.op is Op.EXTERN:
            packet = getattr(node.arg.target, "overloadpacket", None)
            return getattr(packet, "__name__", None) in _FRESH_EXTERNS
        return node.op not in (Op.GETITEM, Op.TENSOR)

    def _write_over(self, root: Node, node: Node) -> str:
        name, over = self.var[root], self.var[node]
        if node.op is not Op.INPUT:
            return f"{name} = {over}  # written over {over}, which dies here"
        # a saved tensor: with retain_graph=True autograd keeps it for another backward
        self.constants["keep_graph"] = torch._C._autograd._get_current_graph_task_keep_graph
        fresh = self._allocate(root).split(" = ", 1)[1]
        return f"{name} = {over} if not keep_graph() else {fresh}  # written over {over}, which dies here"

    def _allocate(self, node: Node) -> str:
        """A kernel's output buffer, through the fast allocator of its device: dense, or with the
        strides eager gives an output; CPU buffers that can reach the huge-page threshold are
        advised onto 2 MB pages."""
        dtype = str(dt.to_torch(node.dtype))
        strides = shape_tuple(self.s.buffers[node].strides)
        device = "cuda" if node.device.startswith("cuda") else "cpu"
        text = f"{self.var[node]} = empty_{device}({shape_tuple(node.shape)}, {strides}, {dtype})"
        if device == "cpu":
            nbytes = sh.static(sh.numel(node.shape) * node.dtype.itemsize)
            if nbytes is None or nbytes >= self.huge_page_bytes > 0:
                text = f"{self.var[node]} = advise_huge(empty_cpu({shape_tuple(node.shape)}, {strides}, {dtype}))"
        return text

    def _extern(self, step: ExternStep) -> None:
        node = step.node
        call = node.arg
        target = self._const(call.target, _safe(call.name))
        dense = self._dense_views(node)
        args = [self._template(a, node, dense) for a in call.args]
        args += [f"{k}={self._template(v, node, dense)}" for k, v in call.kwargs.items()]
        result = f"{target}({', '.join(args)})"
        if call.binds is not None:
            self.emit(f"{call.binds.name} = {result}  # a size only the data knows")
            self.known_symbols.add(call.binds)
            self._emit_size_checks()
            return
        if node.shape is not None:
            self.emit(f"{self.var[node]} = {result}")
            self._bind_from(node)
            self._dense_for_kernels(node)
            return
        tmp = f"res{len(self.lines)}"
        self.emit(f"{tmp} = {result}")
        for getitem in [n for n in self.s.buffers if n.op is Op.GETITEM and n.inputs[0] is node]:
            path = getitem.arg if isinstance(getitem.arg, tuple) else (getitem.arg,)
            self.emit(f"{self.var[getitem]} = {tmp}{''.join(f'[{i}]' for i in path)}")
            self._bind_from(getitem)
            self._dense_for_kernels(getitem)

    def _bind_from(self, node: Node) -> None:
        for sym, source in self.bind_after.get(node, ()):
            self.emit(f"{sym.name} = {source}  # a size only this result knows")
            self.known_symbols.add(sym)
        self._emit_size_checks()

    def _dense_for_kernels(self, node: Node) -> None:
        """Kernels read an ATen result densely. What the graph returns keeps eager's layout: a
        backward program was traced with it (a channels_last convolution saved for its backward:
        returned dense, the backward kernels read it as channels_last, every gradient wrong)."""
        name = self.var[node]
        if name not in self.kernel_reads:
            return
        if node in self.outputs or node in self.viewed_for_outputs:
            self.eager_layout[node] = f"{name}_eager"
            self.emit(f"{name}_eager = {name}  # returned as eager lays it out")
        target = (node.inputs[0] if node.op is Op.GETITEM else node).arg.target
        if getattr(target, "namespace", "aten") not in ("aten", "prims") and node.shape is not None:
            # a custom op's sizes come from its user-written fake: one that disagrees with the
            # op would have the kernels read past the result's memory
            expected = shape_tuple(node.shape)
            message = f"{op_name(target)}: the op returned sizes {{}}, its fake (register_fake) gives {{}}"
            self.emit(f"if tuple({name}.shape) != {expected}: "
                      f"raise RuntimeError({message!r}.format(tuple({name}.shape), {expected}))")
        if node.dtype is not None:
            # kernels are built for the traced dtype; a meta function may disagree with the op
            # (torch 2.11 typed unique's inverse float32): they would read the bits as it
            dtype = str(dt.to_torch(node.dtype))
            self.emit(f"if {name}.dtype != {dtype}: {name} = {name}.to({dtype})  # the dtype kernels read")
        strides = aten_result_strides(node)
        if strides is not None:
            # (channels_last, as eager lays it out: copied only where ATen laid it out otherwise)
            self.emit(f"{name} = as_traced({name}, {shape_tuple(strides)})  # kernels read it as eager lays it out")
            return
        self.emit(f"{name} = {name}.contiguous()  # kernels read it densely")

    def _dense_views(self, node: Node) -> frozenset[int]:
        """The tensor inputs of an ATen call that eager had contiguous but ember hands over as a
        view, or as another ATen call's channels_last result, which may not be: the graph's clone
        (``.contiguous()``) became no op of ember's, and some ops need the layout
        (``view_as_complex`` a last stride of 1, a custom kernel's ``x.view(-1)``). Not for an op
        that writes its inputs: a copy would take the write."""
        call = node.arg
        target = call.target
        if getattr(getattr(target, "_schema", None), "is_mutable", True):
            return frozenset()
        return frozenset(i for i, (x, strides) in enumerate(zip(node.inputs, call.input_strides))
                         if strides is None and x.shape and (
                             x not in self.s.buffers and x.op in VIEW_OPS and not self._contiguous_view(x)
                             or aten_result_strides(x) is not None))

    def _contiguous_view(self, x: Node) -> bool:
        """Is view ``x`` of a buffer or an input contiguous whatever the sizes (its strides
        composed over theirs)? False where that is not known."""
        chain = []
        while x not in self.s.buffers and x.op in VIEW_OPS:
            chain.append(x)
            x = x.inputs[0]
        if x in self.s.buffers:
            base = self.s.buffers[x].strides
        elif x.op is Op.INPUT and x.arg.strides is not None:
            base = x.arg.strides
        else:
            return False
        strided = (base, sympy.Integer(0))
        for view in reversed(chain):
            strided = compose_strided(view, strided)
            if strided is None:
                return False
        return all(sh.equal(a, b) or sh.is_one(n) for a, b, n in zip(strided[0], sh.contiguous_strides(chain[0].shape),
                                                                        chain[0].shape))

    def _template(self, t: Any, node: Node, dense: frozenset[int] = frozenset()) -> str:
        if isinstance(t, ArgRef):
            x = node.inputs[t.index]
            if x not in self.var and x.op is Op.INPUT and x.arg.kind == "opaque":
                return x.arg.name  # passed through as given (the CUDA generator a checkpointed dropout replays)
            return f"{self.var[x]}.contiguous()" if t.index in dense else self.var[x]
        if isinstance(t, list):
            return "[" + ", ".join(self._template(x, node, dense) for x in t) + "]"
        if isinstance(t, tuple):
            return "(" + "".join(self._template(x, node, dense) + ", " for x in t) + ")"
        if isinstance(t, dict):
            return "{" + ", ".join(f"{k!r}: {self._template(v, node, dense)}" for k, v in t.items()) + "}"
        if isinstance(t, sympy.Basic):
            return pexpr(t)
        if isinstance(t, bool) or t is None or isinstance(t, (int, str)):
            return repr(t)
        if isinstance(t, float):
            return repr(t) if math.isfinite(t) else f"float({str(t)!r})"
        if isinstance(t, torch.dtype):
            return str(t)
        return self._const(t, "arg")

    def _view(self, step: ViewStep) -> None:
        # (an output's view is taken of eager's layout, as the graph reading it was traced)
        expr = self.eager_layout.get(step.base, self.var[step.base]) if step.node in self.outputs else (
            self.var[step.base])
        name = f"view{len(self.var)}"
        self.var[step.node] = name
        self.emit(f"{name} = {self._replayed(expr, step.node, step.base)}")

    @staticmethod
    def _replayed(expr: str, view: Node, base: Node) -> str:
        """The chain of views from ``base`` (the tensor ``expr``) up to ``view``, as Python."""
        chain = view_chain(view, base)
        assert chain is not None, f"{view} is no chain of views of {base}"
        return replayed_chain(expr, chain)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def _shifted_symbol(e: sympy.Expr) -> tuple[sympy.Symbol, int] | None:
    """(s, c) for a size ``s + c``: the symbol is the size less c."""
    if e.is_Add and len(e.args) == 2:
        const, sym = sorted(e.args, key=lambda a: not a.is_Integer)
        if const.is_Integer and sym.is_Symbol:
            return sym, int(const)
    return None


def _template_symbols(t: Any) -> set[sympy.Symbol]:
    if isinstance(t, sympy.Basic):
        return set(t.free_symbols)
    if isinstance(t, (list, tuple)):
        out: set[sympy.Symbol] = set()
        for x in t:
            out |= _template_symbols(x)
        return out
    if isinstance(t, dict):
        return _template_symbols(list(t.values()))
    return set()


def write_wrapper(schedule: Schedule, calls: dict[str, KernelCall], timed: bool = False,
                  huge_page_bytes: int = 0) -> Wrapper:
    return WrapperWriter(schedule, calls, timed, huge_page_bytes).write()

