"""Inputs whose autograd state the compiled graph cannot carry: forward-mode AD dual tensors,
and inference tensors in a training graph; and fake tensors, which hold no data for its kernels.

**Dual tensors.** Dynamo does not guard on an input's tangent, and AOTAutograd traces the graph
without one, so a graph compiled for plain tensors is also called with dual tensors. ember's
kernels compute primals only: the tangent of a value they produce was dropped (``x.sin()`` came
back without one), and a tangent through an ATen call inside the program (a matmul) reached the
output without the kernels' part of the derivative, a silently wrong jvp. A call with a dual
input runs Dynamo's graph eagerly instead, where every op carries its tangent, as in eager.

**Inference tensors.** A tensor made under ``torch.inference_mode`` (a teacher's logits) may
enter autograd's graph where no op saves it: eager's ``kl_div(s.log_softmax(-1), t.softmax(-1))``
saves ``t.softmax(-1)``, a tensor of its own. AOTAutograd's partitioner saves the inputs it
recomputes from, ``t`` itself, and autograd refuses it ("Inference tensors cannot be saved for
backward") where eager computes. Dynamo guards on inference-ness, so a training graph compiled
for such inputs gets copies of them, normal tensors of the same layout, at each call. Two such
graphs run eagerly instead: one whose ops eager's autograd refuses (``x * w`` saves ``x``; an
in-place write to one, a BatchNorm built under inference_mode updating its running statistics in
training, which on the copy was lost without eager's error: the error is eager's), and one
returning a view of such an input (a view of the copy would be a normal tensor over other memory).

**Fake tensors.** Under a ``FakeTensorMode`` (shape and memory estimates, export), or with fake
tensors as inputs, eager computes fake results. The compiled program's buffers came back fake
from its allocations and its kernels wrote through their null data pointers: a segfault. Such
a call runs Dynamo's graph eagerly, with no warning (shapes without data, as meta tensors).
Dynamo guards on an input's type, so a graph compiled for fake inputs only ever sees fake ones,
which is decided once, when it compiles; a fake mode around a call is checked at each call.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef


def _has_tangent(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and forward_ad.unpack_dual(a).tangent is not None for a in args)


def takes_fake_tensors(gm: torch.fx.GraphModule) -> bool:
    """Were any of the inputs Dynamo compiled ``gm`` for fake tensors (the user's, not Dynamo's
    own fakes of real ones)? Dynamo's guards check each tensor input's type: every call gets
    fake ones too."""
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            break
        arg = node.meta.get("grapharg")
        if isinstance(getattr(arg, "example", None), FakeTensor):
            return True
    return False


# the mode stack's depth, a cheap check made first (fake modes are on it, with any other)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE


def eager_for_dual_tensors(compiled: Callable[..., Any], gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """``compiled``, except that a call made with a dual tensor among its inputs runs ``gm``
    (Dynamo's graph of torch-level ops) eagerly, with one warning per graph; so does, without
    one, a call under a fake tensor mode, whose results eager makes fake."""
    warned = False

    def call(*args: Any) -> Any:
        nonlocal warned
        if _dispatch_modes() and torch._C._get_dispatch_mode(_FAKE_MODE) is not None:
            return gm.forward(*args)
        # (no dual level entered: the usual case costs one global's read)
        if forward_ad._current_level >= 0 and _has_tangent(args):
            if not warned:
                warned = True
                warnings.warn("ember: a compiled graph called with forward-mode AD dual tensors runs eagerly "
                              "(ember's kernels compute no tangents)", RuntimeWarning, stacklevel=2)
            return gm.forward(*args)
        return compiled(*args)

    return call


def inference_inputs(example_inputs: Sequence[Any]) -> list[int]:
    """Indices of the inference tensors among the inputs of a graph AOTAutograd compiles for
    training (grad mode on, an input requiring grad); empty for any other graph."""
    tensors = [(i, t) for i, t in enumerate(example_inputs) if isinstance(t, torch.Tensor)]
    if not torch.is_grad_enabled() or not any(t.requires_grad for _, t in tensors):
        return []
    return [i for i, t in tensors if t.is_inference()]


def autograd_refuses_an_inference_tensor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Does eager's autograd refuse the graph, an op of it saving an inference tensor for the
    backward (``x * w`` with ``x`` one and ``w`` requiring grad) or writing one in place outside
    inference mode (``running_mean.mul_(0.9)``)? The graph runs on fake inputs
    of the same kinds, fresh ones: an in-place op must not change Dynamo's, which AOTAutograd
    traces next. Any other failure says nothing (AOTAutograd's trace decides)."""
    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        return False
    fresh = []
    try:
        with fake_mode:
            for t in example_inputs:
                if isinstance(t, torch.Tensor):
                    # (an inference tensor requiring grad, a parameter made under inference_mode,
                    # can only be made so inside it: requires_grad_ outside refuses it)
                    with torch.inference_mode(t.is_inference()):
                        t = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device,
                                                requires_grad=t.requires_grad)
                fresh.append(t)
            torch.fx.Interpreter(gm).run(*fresh)
    except RuntimeError as e:
        return any(refusal in str(e) for refusal in _REFUSALS)
    except Exception:  # noqa: BLE001 -- a graph the check cannot run: AOTAutograd's trace decides
        return False
    return False


_REFUSALS = ("Inference tensors cannot be saved for backward",
             "Inplace update to inference tensor outside InferenceMode")


def returns_a_view_of(gm: torch.fx.GraphModule, indices: Sequence[int]) -> bool:
    """Does Dynamo's graph return one of these inputs, or a view of one (its memory)?"""
    placeholders = gm.graph.find_nodes(op="placeholder")
    storages = {_storage(placeholders[i]) for i in indices if i < len(placeholders)}
    output = next(iter(gm.graph.find_nodes(op="output")), None)
    if output is None:
        return False
    returned = torch.fx.node.map_aggregate(output.args, lambda n: n)
    nodes: list[torch.fx.Node] = []
    torch.fx.node.map_arg(returned, nodes.append)
    return None in storages or any(_storage(n) in storages for n in nodes)


def _storage(node: torch.fx.Node) -> Any:
    val = node.meta.get("example_value")
    return StorageWeakRef(val.untyped_storage()) if isinstance(val, torch.Tensor) else None


def with_normal_copies(compiled: Callable[..., Any], indices: Sequence[int]) -> Callable[..., Any]:
    """``compiled``, called with a normal copy of each input at ``indices`` (inference tensors),
    laid out as the input is: the program reads it with the strides Dynamo guarded."""
    def call(*args: Any) -> Any:
        args = list(args)
        for i in indices:
            args[i] = _normal_copy(args[i])
        return compiled(*args)

    return call


def _normal_copy(t: torch.Tensor) -> torch.Tensor:
    if not any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.size())):
        return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    # (an expanded input: its memory, copied, under the same strides; copy_ refuses to write
    # through a stride of 0)
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


def drop_leaf_mutation_grads(gm: torch.fx.GraphModule) -> None:
    """In a backward graph, return None, not the tangent of its in-place update, as the gradient
    of a leaf input the forward wrote in place (a target network's ``p.lerp_(q, tau)`` under
    no_grad) where AOTAutograd does not keep the write in the graph (it keeps writes under
    no_grad: ``keep_inference_input_mutations``), so the updated leaf is an output of the
    compiled function whose tangent the backward passes straight back to the leaf; AOTAutograd
    copies the update into a detached leaf (a leaf needing grad can only be written where
    autograd does not see it), so that tangent is always the zeros autograd
    fills in for an unused output, and the leaf's ``.grad`` became zeros where eager leaves
    None (Adam's momentum and weight decay then moved the target network). A gradient that is
    more than the bare tangent (the leaf also feeds the loss) is kept as it is."""
    try:
        from torch._functorch._aot_autograd.descriptors import (
            GradAOTOutput,
            InputMutationAOTOutput,
            PlainAOTInput,
            TangentAOTInput,
        )
    except ImportError:  # (a torch without graph descriptions: gradients as AOTAutograd made them)
        return
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    if meta is None:
        return
    output = gm.graph.output_node()
    descs = output.meta.get("desc")
    (values,) = output.args
    if not isinstance(descs, (list, tuple)) or not isinstance(values, (list, tuple)) or len(descs) != len(values):
        return
    changed = list(values)
    for k, (value, desc) in enumerate(zip(values, descs)):
        if not (isinstance(desc, GradAOTOutput) and isinstance(desc.grad_of, PlainAOTInput)):
            continue
        if not isinstance(value, torch.fx.Node) or value.op != "placeholder":
            continue
        tangent_of = getattr(value.meta.get("desc"), "output", None)
        if not (isinstance(value.meta.get("desc"), TangentAOTInput) and isinstance(tangent_of, InputMutationAOTOutput)
                and tangent_of.mutated_input == desc.grad_of):
            continue
        idx = desc.grad_of.idx
        if 0 <= idx < len(meta.input_info) and meta.input_info[idx].is_leaf:
            changed[k] = None
    if changed != list(values):
        output.args = (type(values)(changed),)
        gm.graph.eliminate_dead_code()  # (the placeholder stays: AOTAutograd passes every tangent)
        gm.recompile()


def aot_input_views(gm: torch.fx.GraphModule) -> dict[int, tuple[int, int | None]]:
    """{graph output i: (placeholder k, the graph output j holding the value written into k, or
    None)} for the outputs AOTAutograd rebuilds as views of input k. With symbolic sizes it
    rebuilds them from the strides and offset of the tensor the graph returns, which in ember's
    IR could be a view of the value written into k (``x.mul_(2).reshape(-1)``, x strided: a fresh
    value's strides; aot_eager and Inductor alike returned the wrong elements) or a copy (a
    reshape that only the guarded sizes make a view). Empty outside an AOTAutograd compile."""
    try:
        from torch._functorch._aot_autograd.descriptors import (
            InputMutationAOTOutput,
            PlainAOTInput,
            PlainAOTOutput,
        )
        from torch._functorch._aot_autograd.schemas import OutputType
    except ImportError:  # (a torch without graph descriptions)
        return {}
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    descs = gm.graph.output_node().meta.get("desc")
    if meta is None or not isinstance(descs, (list, tuple)):
        return {}
    placeholders = {n.meta.get("desc"): k for k, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    written = {d.mutated_input: j for j, d in enumerate(descs) if isinstance(d, InputMutationAOTOutput)}
    views = {}
    for i, d in enumerate(descs):
        info = meta.output_info[d.idx] if isinstance(d, PlainAOTOutput) and d.idx < len(meta.output_info) else None
        if info is None or info.output_type != OutputType.alias_of_input or info.base_idx is None:
            continue
        base = PlainAOTInput(info.base_idx)
        if base in placeholders:
            views[i] = (placeholders[base], written.get(base))
    return views
