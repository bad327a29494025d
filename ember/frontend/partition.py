"""The training partitioner: where the gradient of a scalar loss is computed.

AOTAutograd hands the partitioner one *joint* graph (primals and tangents in, forward outputs and
gradients out) and asks for a forward graph and a backward graph. AOTAutograd's min-cut
rematerialization gives the backward what it needs to recompute the gradient: usually the primals
themselves, which the backward reads again, and the chain from them to the gradient, which it
computes again.

**Gradient in the forward.** When the joint graph has exactly one tangent and it belongs to a
scalar output (a loss), every gradient is linear in that one number. The tangent may first pass
through scalar arithmetic before it meets a tensor (``t / n`` for a mean over a count ``n``); call
the last such scalar ``u``. Then ``grad_i = u * K_i``, where ``K_i`` is the gradient at ``u = 1``
and depends on the primals only. (Where that arithmetic reads only numbers and sizes, ``u`` is the
tangent itself: ``K_i`` then folds ``/ n`` as eager does, and stays in range where ``K_i * u``
does.) This plan computes the ``K_i`` in the forward graph next to the
loss (ember fuses both into the loss's kernels, one pass over the inputs) and saves only the ``K_i``
plus the scalars ``u`` needs; layout ops that end a ``K_i`` (the ``stack`` of 4 box coordinates,
an ``expand``) are left to the backward, so the forward saves the columns its loss loop produces.
The backward is left with ``u`` and ``grad_i = K_i * u``: one pointwise kernel that reads no
input. It never writes into a saved ``K_i``, so ``backward(retain_graph=True)`` can run again.
The inputs eager's backward would read are saved too, unread: autograd then checks their
versions, and an input changed in place between forward and backward raises as in eager.

**Cost model.** Both plans are measured on their actual graphs, with symbolic sizes at their hints:

    bytes = backward reads (saved tensors, tangent) + backward writes (gradients)
          + the forward's extra writes (saved tensors that are not already inputs or outputs)

min-cut's partition is computed too, and the gradient-in-forward plan is used when its bytes are
not greater. Ties go to it, because it also drops the backward's recomputation (the op counts are
logged with the decision at EMBER_DEBUG=1) and leaves a backward of one kernel. Examples:

* The padded GIoU loss over (B, 256, 4) boxes: min-cut's backward reads predictions, targets and a
  saved mask and writes the gradient (50 bytes a box); this plan writes K, reads it and writes the
  gradient (48 bytes a box). The backward's recomputation of the whole GIoU chain is gone.
* ``x[idx].square().sum()`` with a large ``x`` and few indices: K is dense (a scatter into zeros),
  which this plan would write, read and scale, while min-cut's backward writes it once. min-cut.
* ``(x * w).sum()``: min-cut saves ``w``, a primal, for free; K would be a copy of it. min-cut.

**16-bit floats.** ``K_i`` keeps the gradient's dtype. ember computes it in float32 and rounds it
once; the backward's product rounds once more, and is exact when ``u`` is 1 (``loss.backward()``
of a sum). Eager rounds after every op of the chain, so the result stays within eager's error.

Anything else goes to min-cut unchanged: several tangents or a non-scalar one, mutating or random
ops, RNG seed or backward-state inputs, higher-order ops, activation-checkpoint tags, a gradient
that does not depend on the tangent or is not linear in it (a gradient hook or a custom backward
that clips it: linearity.py), a masked chain whose scale may be inf where eager's gradient would
be NaN (cross-entropy's mean with class weights that may all be 0: scale_nan.py), or the option
``grad_in_forward=False`` (``EMBER_GRAD_IN_FORWARD=0``).
"""

from __future__ import annotations

import operator
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch.partitioners import _extract_fwd_bwd_modules, min_cut_rematerialization_partition
from torch._guards import detect_fake_mode
from torch.fx.experimental import symbolic_shapes

from ..config import Config, log
from ..config import config as default_config
from ..runtime import stats
from .linearity import is_view_op, masks_gradient, nonlinear_op
from .row_ids import mark_row_ids_for_recompute
from .scale_nan import hidden_nan

aten = torch.ops.aten
prims = torch.ops.prims

Modules = tuple[fx.GraphModule, fx.GraphModule]

# A symbolic size without a hint (rare: sizes from data) is costed at this.
_UNHINTED_SIZE = 8192


@dataclass(frozen=True)
class PlanCost:
    """Bytes one partition moves for the backward, and the ops its backward graph runs."""

    read: int    # backward reads: saved tensors and the tangent
    write: int   # backward writes: the gradients
    saved: int   # forward writes only for the backward (saved tensors not already inputs/outputs)
    ops: int     # compute ops in the backward graph (the work it repeats or does)

    @property
    def bytes(self) -> int:
        return self.read + self.write + self.saved

    def __str__(self) -> str:
        return f"{self.bytes} B (read {self.read}, write {self.write}, saved {self.saved}), {self.ops} op(s)"


def partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
              static_lifetime_input_indices: list[int] | None = None, cfg: Config | None = None,
              **kwargs: Any) -> Modules:
    """AOTAutograd's ``partition_fn``: the gradient-in-forward plan where it moves fewer bytes
    than min-cut (see the module docstring), min-cut rematerialization otherwise."""
    cfg = cfg or default_config
    mark_backward_reads(joint_module)

    def min_cut() -> Modules:
        mark_row_ids_for_recompute(joint_module)  # ragged row ids: recomputed, never saved
        keep_what_mutated_inputs_fed(joint_module)
        return min_cut_rematerialization_partition(
            joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_indices=static_lifetime_input_indices, **kwargs)

    planned = gradient_in_forward(joint_module, num_fwd_outputs, cfg) if cfg.grad_in_forward else None
    if planned is None:
        return min_cut()
    default = min_cut()
    try:
        mine, theirs = plan_cost(*planned, num_fwd_outputs), plan_cost(*default, num_fwd_outputs)
    except Exception:  # noqa: BLE001 -- a graph the cost model cannot read keeps min-cut's plan
        log(1, f"partition: no cost for the plans, using min-cut:\n{traceback.format_exc()}", cfg)
        return default
    chosen = mine.bytes <= theirs.bytes
    log(1, f"partition: gradient in forward {mine}; min-cut {theirs}; "
           f"using {'gradient in forward' if chosen else 'min-cut'}", cfg)
    if not chosen:
        return default
    stats.bump("grads_in_forward")
    return planned


READ_BY_BACKWARD = "ember_read_by_backward"
_BACKWARD_TAGS = ("is_backward", "must_be_in_backward")


def mark_backward_reads(joint_module: fx.GraphModule) -> None:
    """Mark the forward values that a backward op reads in the joint graph, before either plan
    splits it: the mark travels with each copy of the node (the forward's, a backward's
    recomputation), and the lowering makes every reader of a marked value read it rounded as
    eager saved it (``Graph.eager_saved``), in both graphs alike. Marked on one side only, a
    bfloat16 ``layer_norm(cos(x) ** 2, (1,))`` squared the unrounded cos in the forward and the
    rounded one in its backward's recomputation: ``x - mean`` of one element came out an ulp
    instead of 0, times ``rstd`` (316), and the gradient 600 where eager's is 0 (CPU fuzz seed
    372043163940)."""
    for node in joint_module.graph.nodes:
        if (node.op == "call_function" and node.meta.get("partitioner_tag") == "is_forward"
                and any(u.meta.get("partitioner_tag") in _BACKWARD_TAGS for u in node.users)):
            node.meta[READ_BY_BACKWARD] = True


def keep_what_mutated_inputs_fed(joint_module: fx.GraphModule) -> None:
    """Ban min-cut from recomputing, in the backward, what the forward computed from an input
    the graph writes in place (``y = (w * x).exp()`` then ``w.mul_(2)`` under no_grad): the write
    is copied into the input after the forward runs, so a backward recomputing ``exp`` would read
    the new ``w`` (and autograd, checking the saved input's version, raised "modified by an
    inplace operation" where eager, which saved ``exp``, computes). The first non-view forward
    users of such an input are marked must-save; what the backward reads of the input itself
    (eager saved it too, and raises as eager does) stays saved."""
    from torch.utils.checkpoint import CheckpointPolicy
    try:
        from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput
    except ImportError:  # (a torch without output descriptions: min-cut as before)
        return

    descs = joint_module.graph.output_node().meta.get("desc") or ()
    mutated = [d.mutated_input for d in descs if isinstance(d, InputMutationAOTOutput)]
    # (a write AOTAutograd keeps in the graph: copy_ into the input at the forward's end)
    written = {n.args[0] for n in joint_module.graph.find_nodes(op="call_function", target=aten.copy_.default)}
    if not mutated and not written:
        return
    backward: set[fx.Node] = set()  # nodes computed from a tangent
    for node in joint_module.graph.nodes:
        if _is_tangent(node) or any(a in backward for a in node.all_input_nodes):
            backward.add(node)
    for primal in joint_module.graph.find_nodes(op="placeholder"):
        if primal.meta.get("desc") not in mutated and primal not in written:
            continue
        stack = list(primal.users)
        while stack:
            user = stack.pop()
            if user.op != "call_function" or user in backward or user.target is aten.copy_.default:
                continue
            if _is_view(user):
                stack.extend(user.users)
            elif user.meta.get("recompute") is None:
                user.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def gradient_in_forward(joint_module: fx.GraphModule, num_fwd_outputs: int,
                        cfg: Config | None = None) -> Modules | None:
    """The forward and backward modules of the gradient-in-forward plan, or None where it does
    not apply. ``joint_module`` is not modified (the plan is built on a copy of its graph)."""
    try:
        return _build(joint_module, num_fwd_outputs, cfg or default_config)
    except Exception:  # noqa: BLE001 -- an unforeseen graph gets min-cut, never a failed compile
        log(1, f"partition: gradient in forward failed, using min-cut:\n{traceback.format_exc()}", cfg)
        return None


def _build(joint_module: fx.GraphModule, num_fwd_outputs: int, cfg: Config) -> Modules | None:
    graph = fx.Graph()
    copied, old_output = graph.graph_copy(joint_module.graph, {}, return_output_node=True)
    output = graph.output(copied)
    output.meta = dict(old_output.meta)  # the outputs' descriptions AOTAutograd reads back
    graph.eliminate_dead_code()

    reason = _unsupported(graph)
    if reason:
        log(1, f"partition: min-cut ({reason})", cfg)
        return None
    (tangent,) = [n for n in graph.nodes if _is_tangent(n)]
    flat = pytree.arg_tree_leaves(*output.args)
    fwd_outputs, grads = flat[:num_fwd_outputs], flat[num_fwd_outputs:]
    dependent = _dependents(graph, tangent)
    reason = _check_outputs(tangent, fwd_outputs, grads, dependent)
    if reason:
        log(1, f"partition: min-cut ({reason})", cfg)
        return None

    if any(isinstance(g, fx.Node) and getattr(g.meta.get("val"), "dtype", None) == torch.float16 for g in grads):
        # K is the gradient at u = 1 in the gradient's dtype: float16's range cuts it off (a
        # loss scaled by 1e-4 had an inf K where K * u is 9; a small one went subnormal)
        log(1, "partition: min-cut (float16 gradients)", cfg)
        return None
    witnesses = _version_witnesses(fwd_outputs, grads, tangent)
    scale, kept = _scale(graph, tangent, dependent)
    if _numbers_only(kept, dependent):
        # u is the tangent times numbers (a loss * 1e-3, / n): K at tangent 1 is eager's own
        # chain, where K at u = 1 may leave the dtype's range (1 / 1e-40 is inf in float32,
        # 1e-3 / 1e-40 is not). Only a scale read from forward tensors (a mask's count) stays u:
        # K must not wait for that reduction, so the loss and K stay one pass over the inputs
        scale, kept = tangent, {tangent}
    scaled_part = [n for n in graph.nodes if n in dependent and n not in kept]
    nonlinear = nonlinear_op(scaled_part, dependent)
    if nonlinear:  # (a gradient hook or a custom backward: grad(u) = u * grad(1) does not hold)
        log(1, f"partition: min-cut (the gradient is not linear in the incoming one: {nonlinear})", cfg)
        return None
    masked = masks_gradient(scaled_part)
    # (before the scale is replaced: the check follows its uses)
    hidden = hidden_nan(scale, kept, scaled_part, dependent) if masked else None
    if hidden:
        log(1, f"partition: min-cut ({hidden})", cfg)
        return None
    scale_val = scale.meta["val"]
    fake_mode = detect_fake_mode([scale_val])

    # K_i: the gradient chain with the scale replaced by a constant one. The scale keeps the
    # users that compute it (and the output, where it is itself a gradient).
    first = next(n for n in graph.nodes if n.op != "placeholder")
    shape = [int(d) for d in scale_val.shape]
    full_kwargs = {"dtype": scale_val.dtype, "layout": torch.strided, "device": scale_val.device,
                   "pin_memory": False}
    with graph.inserting_before(first):
        one = graph.call_function(aten.full.default, (shape, 1), full_kwargs)
    with fake_mode:
        one.meta["val"] = aten.full.default(shape, 1, **full_kwargs)
    for user in list(scale.users):
        if user.op != "output" and user not in kept:
            user.replace_input_with(scale, one)

    # grad_i = K_i * u, in the gradient's dtype; u as a 0-d tensor so it neither broadcasts K_i
    # to more dims nor promotes K_i's dtype. A u of NaN makes the products NaN, as eager's
    # gradients are. A u of +-inf (a tangent of inf, a mean's divisor of 0) makes them +-inf
    # where eager's may be NaN instead (a matmul's backward adding inf and -inf): non-finite
    # either way, which is what GradScaler checks, but not the same values. Where the chain masks
    # (cross-entropy's ignored rows: where(target != ignore, g / total_weight, 0)), eager masks
    # after scaling: with every row ignored u is g / 0, whose product with the zeros is NaN, not
    # eager's 0, so there grad_i is 0 where K_i is. A K_i that is 0 for another reason (a factor
    # of 0: a class weight) is eager's 0 * inf = NaN instead; telling the two zeros apart would
    # take a second chain in the forward, so where u's divisor may be 0 while such a factor is in
    # the chain the plan is not taken (scale_nan.py). Known limit: a u made inf or NaN by the
    # tangent (backward(inf)) or by a forward value that is not finite gives those elements 0.
    scaled: dict[fx.Node, fx.Node] = {}
    with graph.inserting_before(output), fake_mode:
        u = scale
        if scale_val.dim() != 0:
            u = _call(graph, aten.view.default, scale, [])
        for g in grads:
            if not isinstance(g, fx.Node) or g is scale or g in scaled:
                continue
            product = _call(graph, aten.mul.Tensor, g, u)
            if masked:
                zero_kwargs = {**full_kwargs, "dtype": product.meta["val"].dtype}
                zero = graph.call_function(aten.full.default, ([], 0), zero_kwargs)
                zero.meta["val"] = aten.full.default([], 0, **zero_kwargs)
                product = _call(graph, aten.where.self, _call(graph, aten.ne.Scalar, g, 0), product, zero)
            if product.meta["val"].dtype != g.meta["val"].dtype:
                product = _call(graph, prims.convert_element_type.default, product, g.meta["val"].dtype)
            scaled[g] = product
    output.args = pytree.tree_map_only(fx.Node, lambda n: scaled.get(n, n), output.args)

    # Saved: every K_i (or what its final layout ops read), and what the kept scalar arithmetic
    # reads from the forward.
    groups = [_saved_for(k) for k in scaled] + [[a for a in n.all_input_nodes if a not in dependent]
                                                 for n in kept]
    saved = list(dict.fromkeys(a for group in groups for a in group))  # in order, once each
    saved_syms = [n for n in saved if _is_sym(n)]
    saved_tensors = [n for n in saved if not _is_sym(n)]
    joint = fx.GraphModule(joint_module, graph)
    # The same extraction min-cut ends with: forward outputs = real outputs + saved tensors +
    # saved SymInts (plus the symbols the saved tensors' sizes need); backward inputs = saved
    # SymInts + saved tensors + tangents.
    fw, bw = _extract_fwd_bwd_modules(joint, saved_tensors, saved_sym_nodes=saved_syms,
                                      num_fwd_outputs=num_fwd_outputs)
    try:
        _save_unread(fw, bw, witnesses, num_fwd_outputs)
    except Exception:  # noqa: BLE001 -- a torch whose graphs look otherwise: no version checks, as before
        fw, bw = _extract_fwd_bwd_modules(joint, saved_tensors, saved_sym_nodes=saved_syms,
                                          num_fwd_outputs=num_fwd_outputs)
        log(1, f"partition: inputs not saved for version checks:\n{traceback.format_exc()}", cfg)
    return fw, bw


def _version_witnesses(fwd_outputs: Sequence[Any], grads: Sequence[Any], tangent: fx.Node) -> list[fx.Node]:
    """What eager's backward reads that the caller can change in place: the inputs, and the
    forward's outputs (or what they are views of), read by joint-graph nodes that only the
    gradients need. The plan's backward reads none of them, but saving them (inputs and outputs:
    no bytes written) lets autograd check their versions, so a step that changes one in place
    between forward and backward (``y = f(x); y.zero_()``) raises eager's "modified by an inplace
    operation" instead of getting the gradient at the old values."""
    backward_only = _ancestors(grads) - _ancestors(fwd_outputs)
    returned: set[fx.Node] = set()  # the forward's outputs and the bases they are views of
    for out in fwd_outputs:
        while isinstance(out, fx.Node) and out not in returned:
            returned.add(out)
            out = _view_base(out)
    witnesses: dict[fx.Node, None] = {}
    for n in backward_only:
        for a in n.all_input_nodes if n.op == "call_function" else ():
            while (base := _view_base(a)) is not None:
                a = base  # (a view of an input, t[:, None]: eager saves it, sharing t's version)
            if a is tangent or not isinstance(a.meta.get("val"), torch.Tensor):
                continue
            if a.op == "placeholder" or a in returned:
                witnesses[a] = None
    return list(witnesses)


def _view_base(node: fx.Node) -> fx.Node | None:
    """What ``node`` is a view of, if it is one."""
    if node.op == "call_function" and is_view_op(node.target) and node.args and isinstance(node.args[0], fx.Node):
        return node.args[0]
    return None


def _save_unread(fw: fx.GraphModule, bw: fx.GraphModule, inputs: list[fx.Node], num_fwd_outputs: int) -> None:
    """Add ``inputs`` (joint-graph placeholders and forward outputs) to the saved tensors of the extracted graphs:
    first among the forward's saved outputs (those autograd saves with version checks) and
    as backward inputs nobody reads. The extraction drops saved values the backward does not
    read, so they are added after it, keeping its conventions (forward outputs: real outputs,
    saved tensors, saved SymInts; backward inputs: saved SymInts, saved tensors, tangents)."""
    output = fw.graph.output_node()
    outs = list(output.args[0])
    already = {o.name for o in outs[num_fwd_outputs:] if isinstance(o, fx.Node)}
    fw_nodes = {n.name: n for n in fw.graph.nodes if n.op in ("placeholder", "call_function")}
    new = [fw_nodes[n.name] for n in inputs if n.name in fw_nodes and n.name not in already]
    if not new:
        return
    bw_inputs = list(bw.graph.find_nodes(op="placeholder"))
    first_tensor = next(n for n in bw_inputs if not _is_sym(n))  # a saved tensor or the tangent
    for node in new:
        with bw.graph.inserting_before(first_tensor):
            placeholder = bw.graph.placeholder(node.name)
        placeholder.meta = dict(node.meta)
    descs = output.meta.get("desc")
    if descs is not None:  # torch's descriptions of the outputs: saved ones are numbered
        from torch._functorch._aot_autograd.descriptors import SavedForBackwardsAOTOutput
        saved = [type(d)(d.idx + len(new)) for d in descs[num_fwd_outputs:]]
        output.meta["desc"] = (descs[:num_fwd_outputs] + [SavedForBackwardsAOTOutput(i) for i in range(len(new))]
                               + saved)
    output.args = (tuple(outs[:num_fwd_outputs] + new + outs[num_fwd_outputs:]),)
    fw.recompile()
    bw.recompile()


def _ancestors(roots: Sequence[Any]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _saved_for(node: fx.Node) -> list[fx.Node]:
    """What the forward saves so the backward can rebuild K_i: layout ops at the end of its chain
    (a ``stack`` of box coordinates, an ``expand`` of a scalar) run in the backward instead, where
    they fuse into the scaling, when their inputs span no more bytes than their result. Then the
    forward writes columns of the reduction it runs anyway (one kernel with the loss), and an
    expanded constant is not written out at all."""
    tensors = [a for a in node.all_input_nodes if not _is_sym(a)]
    if node.target not in _LAYOUT_OPS or sum(_nbytes(a) for a in tensors) > _nbytes(node):
        return [node]
    saved: list[fx.Node] = []
    for arg in node.all_input_nodes:
        if arg.op == "call_function" and not arg.all_input_nodes:
            continue  # a constant (aten.full): the backward makes its own
        saved.extend([arg] if _is_sym(arg) else _saved_for(arg))
    return saved


_LAYOUT_OPS = {aten.cat.default, aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim,
               aten.squeeze.dims, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               aten.expand.default, aten.permute.default, aten.t.default, aten.transpose.int,
               aten.alias.default}


def _call(graph: fx.Graph, target: Callable[..., Any], *args: Any) -> fx.Node:
    """A new node with its fake value (the caller holds the fake mode)."""
    node = graph.call_function(target, args)
    node.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args])
    return node


def _unsupported(graph: fx.Graph) -> str | None:
    """Why the plan does not apply to this joint graph, or None."""
    tangents = 0
    for node in graph.nodes:
        if node.meta.get("recompute") is not None:
            return "activation checkpointing"
        if node.meta.get("partitioner_tag") in ("must_be_in_forward", "must_be_in_backward"):
            return f"{node.name} is pinned to one graph"
        if node.op == "placeholder":
            if _is_tangent(node):
                tangents += 1
            elif any(word in str(node.target) for word in ("seed", "offset", "rng")):
                return f"RNG input {node.target}"
            elif not isinstance(node.meta.get("val"), (torch.Tensor, torch.SymInt, torch.SymFloat,
                                                       torch.SymBool, int, float, bool)):
                return f"input {node.target} is neither a tensor nor a number"
        elif node.op == "call_function":
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                if target._schema.is_mutable:
                    return f"mutating op {target}"
                if torch.Tag.nondeterministic_seeded in target.tags:
                    return f"random op {target}"
            elif isinstance(target, torch._ops.HigherOrderOperator):
                return f"higher-order op {target}"
        elif node.op not in ("get_attr", "output"):
            return f"{node.op} node"
    if tangents != 1:
        return f"{tangents} tangents"
    return None


def _check_outputs(tangent: fx.Node, fwd_outputs: Sequence[Any], grads: Sequence[Any],
                   dependent: set[fx.Node]) -> str | None:
    val = tangent.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return "the tangent is not a floating-point tensor"
    if not _is_scalar(tangent):
        return f"the output with a gradient is not a scalar ({tuple(val.shape)})"
    if any(isinstance(o, fx.Node) and o in dependent for o in fwd_outputs):
        return "a forward output depends on the tangent"
    if not any(isinstance(g, fx.Node) for g in grads):
        return "no gradients"
    for g in grads:
        if g is None:
            continue
        if not isinstance(g, fx.Node) or g not in dependent or not isinstance(g.meta.get("val"), torch.Tensor):
            return f"gradient {g} is not a tensor computed from the tangent"
    return None


def _dependents(graph: fx.Graph, tangent: fx.Node) -> set[fx.Node]:
    """Nodes computed from the tangent (the backward part of the joint graph)."""
    dependent = {tangent}
    for node in graph.nodes:
        if node.op == "call_function" and any(a in dependent for a in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _scale(graph: fx.Graph, tangent: fx.Node, dependent: set[fx.Node]) -> tuple[fx.Node, set[fx.Node]]:
    """The scalar ``u`` every gradient is linear in, and the nodes that compute it from the
    tangent (kept in the backward).

    The scalar prefix is the tangent and the scalar nodes computed from it and from forward values
    only. If exactly one of them feeds anything else, every gradient goes through it, and it is
    ``u``; otherwise ``u`` is the tangent itself."""
    prefix = {tangent}
    for node in graph.nodes:
        if (node in dependent and node.op == "call_function" and _is_scalar(node)
                and all(a in prefix for a in node.all_input_nodes if a in dependent)):
            prefix.add(node)
    frontier = [n for n in prefix if any(user not in prefix for user in n.users)]
    if len(frontier) != 1:
        return tangent, {tangent}
    (scale,) = frontier
    kept: set[fx.Node] = set()
    stack = [scale]
    while stack:
        node = stack.pop()
        if node not in kept:
            kept.add(node)
            stack.extend(a for a in node.all_input_nodes if a in dependent)
    return scale, kept


def _numbers_only(kept: set[fx.Node], dependent: set[fx.Node]) -> bool:
    """Does the scalar arithmetic from the tangent to ``u`` read nothing but the tangent's chain,
    numbers and sizes (no forward tensor)?"""
    for node in kept:
        for arg in pytree.arg_tree_leaves(*node.args, **node.kwargs):
            if isinstance(arg, fx.Node) and arg not in dependent and not _is_sym(arg):
                return False
    return True


def plan_cost(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int) -> PlanCost:
    """The cost model of the module docstring, on a partition's forward and backward graphs."""
    fw_outputs = _outputs(fw)
    real = {o for o in fw_outputs[:num_fwd_outputs] if isinstance(o, fx.Node)}
    saved = sum(_nbytes(o) for o in fw_outputs[num_fwd_outputs:]
                if isinstance(o, fx.Node) and o not in real and not _aliases_input(o))
    read = sum(_nbytes(p) for p in bw.graph.find_nodes(op="placeholder") if p.users)
    write = sum(_nbytes(o) for o in _outputs(bw) if isinstance(o, fx.Node))
    ops = sum(1 for n in bw.graph.nodes if n.op == "call_function" and not _is_view(n)
              and n.target is not operator.getitem and not _is_sym(n))
    return PlanCost(read, write, saved, ops)


def _outputs(gm: fx.GraphModule) -> list[Any]:
    return pytree.arg_tree_leaves(*next(iter(gm.graph.find_nodes(op="output"))).args)


def _nbytes(node: fx.Node) -> int:
    """Bytes a tensor spans in memory (an expanded tensor spans only its storage)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    sizes = [_hint(s) for s in val.shape]
    if 0 in sizes:
        return 0
    span = 1 + sum((s - 1) * abs(_hint(st)) for s, st in zip(sizes, val.stride()))
    return span * val.element_size()


def _hint(x: Any) -> int:
    if isinstance(x, int):
        return x
    # optimization_hint on torch 2.13, size_hint on 2.11; neither adds a guard
    hint = getattr(symbolic_shapes, "optimization_hint", None) or getattr(symbolic_shapes, "size_hint", None)
    try:
        return int(hint(x, fallback=_UNHINTED_SIZE))
    except Exception:  # noqa: BLE001 -- an unhintable size is costed, not fatal
        return _UNHINTED_SIZE


def _aliases_input(node: fx.Node) -> bool:
    while node.op == "call_function" and _is_view(node):
        node = node.args[0]
    return node.op == "placeholder"


def _is_view(node: fx.Node) -> bool:
    return is_view_op(node.target)


def _is_tangent(node: fx.Node) -> bool:
    # AOTAutograd's own test (torch._functorch._aot_autograd.utils._is_tangent)
    return node.op == "placeholder" and "tangents" in str(node.target)


def _is_sym(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))


def _is_scalar(node: fx.Node) -> bool:
    """A tensor of one element, by static sizes (a symbolic size is never known to be 1)."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and all(type(d) is int and d == 1 for d in val.shape)
