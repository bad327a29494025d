"""How a compiled graph writes the new values of its inputs (``Graph.mutated_inputs``).

AOTAutograd keeps a function's in-place updates of its inputs in the graph
(``keep_inference_input_mutations``): BatchNorm's running stats, an optimizer's parameters and
state, a counter. The graph computes each new value and ends with ``copy_(input, value)``;
lowering turns those into the graph's last outputs. The program then either

* has the kernel that computes the value store it straight into the input's memory, as Inductor
  does: no buffer, no copy. Safe when nothing reads the input after that kernel (the kernel
  itself only at the very element it stores, ``schedule/inplace.py``), the value is not also
  returned nor viewed by an output (a running mean the backward saves), no output eager returns
  in memory of its own comes back in the input's (a clone of the input, which ember's IR made
  the input itself), and the buffer would have the input's size, dtype and strides; or
* copies the value into the input once everything else has run, as AOTAutograd did.

Either way those outputs are not returned: the caller sees its inputs changed, as in eager.
A mixin of wrapper.WrapperWriter (its attributes ``s``, ``var``, ``last_use``, ``output_vars``,
``_memory_of``, ``emit``).
"""

from __future__ import annotations

from collections import Counter

from ..ir.node import Node
from ..schedule.inplace import writes_in_place
from ..schedule.steps import KernelStep


class InputWrites:
    def _keep_given_inputs(self) -> None:
        """The written inputs as the caller gave them (a backward may relayout an input, a 0-d
        host input is moved to the GPU: the copies are not the caller's tensors)."""
        g = self.s.graph
        self.given: dict[Node, str] = {}  # written input -> the variable holding the caller's tensor
        for k in sorted(set(g.mutated_inputs.values())):
            target = g.inputs[k]
            name = self.given[target] = target.arg.name
            if target.arg.to_device or g.name.startswith("backward"):
                self.given[target] = f"{name}_given"
                self.emit(f"{name}_given = {name}  # the caller's tensor, which the function writes")

    def _plan_input_writes(self) -> None:
        """Before the steps: which values may be stored into their input; the inputs, kept alive."""
        g = self.s.graph
        self.returned_outputs = len(g.outputs) - len(g.mutated_inputs)
        counts = Counter(o for o in g.outputs if o is not None)
        backward = g.name.startswith("backward")
        # (an output eager returns in memory of its own that ember's IR made the input itself, a
        # clone: copied at the end, it must copy the old values)
        fresh_memory = {self._memory_of(g.outputs[i]) for i in g.fresh_outputs if g.outputs[i] is not None}
        # (a value whose memory an output comes back in: stored in place, the output would be
        # the caller's input, or a view of it, where eager's is a tensor of its own)
        self.returned_memory = {self._memory_of(o) for o in g.outputs[:self.returned_outputs] if o is not None}
        # (inputs whose old values another input's write copies at the end, a value of theirs
        # or a view of it: ``prev.copy_(cur); cur.copy_(x)`` must not store x into cur first)
        self.read_at_end = {self._memory_of(g.outputs[j]) for j in g.mutated_inputs if g.outputs[j] is not None}
        self.write_into: dict[Node, Node] = {}
        for j, k in sorted(g.mutated_inputs.items()):
            value, target = g.outputs[j], g.inputs[k]
            if target in self.var:
                self.output_vars.add(self.var[target])
            if (counts[value] == 1 and value not in self.write_into and not backward and not target.arg.to_device
                    and target not in fresh_memory):
                self.write_into[value] = target
        self.written_in_place: set[Node] = set()

    def _into_inputs(self, step: KernelStep, i: int) -> dict[Node, Node]:
        """This kernel's outputs that it stores straight into the input they are the new value
        of: {output root: input}."""
        out: dict[Node, Node] = {}
        for root in step.roots:
            target = self.write_into.get(root)
            if target is None or target not in self.s.buffers:
                continue
            info, given = self.s.buffers[root], self.s.buffers[target]
            if (root in self.returned_memory or target in self.read_at_end
                    or root.dtype != target.dtype or root.device != target.device
                    or tuple(root.shape) != tuple(target.shape)
                    or tuple(info.strides or ()) != tuple(given.strides or ())):
                continue
            # the input's memory, read through it or through a view of it: by this kernel at most
            last = {self.var[n]: self.last_use.get(self.var[n], -1) for n in self.var if self._memory_of(n) is target}
            if any(at > i for at in last.values()):
                continue
            now = [v for v, at in last.items() if at == i]
            if root in step.fills:
                # a write at indices into the input (``cache[:, pos] = k``, ``index_add_``): the
                # input already holds what the kernel starts from, so neither copy is made; the
                # fill reads the input, the kernel itself must not
                if (step.fills[root] is not target or now not in ([], [given.name])
                        or any(p.name == given.name for p in step.kernel.params)):
                    continue
            else:
                stores = [v for v in step.kernel.values if v.kind == "store" and v.arg.buffer == info.name]
                if len(stores) != 1 or stores[0].arg.bindings or stores[0].arg.accumulate:
                    continue
                if now and (now != [given.name] or not writes_in_place(step.kernel, given.name, info.name)):
                    continue
            out[root] = target
            self.written_in_place.add(root)
        return out

    def _write_inputs(self, returned: list[str]) -> list[str]:
        """After everything else: the copies of the new values not stored in place; the outputs
        the function returns."""
        g = self.s.graph
        # (a value stored in place is the new value of that one input)
        copies = [(j, k) for j, k in sorted(g.mutated_inputs.items()) if g.outputs[j] not in self.written_in_place]
        # The writes happen at once, as in the graph: a value in memory that another copy
        # overwrites (an input's old value, ``a.copy_(b); b.copy_(old_a)``) is read out first.
        overwritten = {g.inputs[k] for _, k in copies}
        for j, k in copies:
            value, target = g.outputs[j], g.inputs[k]
            memory = self._memory_of(value)
            if memory in overwritten and value is not target:
                self.emit(f"old{j} = {returned[j]}.clone()  # its memory is written below")
                returned[j] = f"old{j}"
        for j, k in copies:
            self.emit(f"{self.given[g.inputs[k]]}.copy_({returned[j]})  # the function's write into its input")
        return returned[:self.returned_outputs]
