"""Dynamo's ``prims.fma`` rewrites of in-place updates, undone where they change eager's result.

Dynamo traces ``x.addcmul_(t1, t2, value=v)`` as ``x.copy_(fma(t1 * t2, v, x))``,
``x.addcdiv_(t1, t2, value=v)`` as ``x.copy_(fma(t1 / t2, v, x))`` and ``x.add_(y, alpha=t)``
with a tensor ``t`` as ``x.copy_(fma(y, t, x))``. The copy then casts silently, where eager
refuses: integer tensors updated by float ones ("result type Float can't be cast to the desired
output type Long"), integer addcdiv ("Integer division with addcdiv is no longer supported"), a
float or complex ``alpha`` for integers, an ``alpha`` with dims. And eager's kernels compute
other values: an integer addcmul_ truncates a float ``value`` to an integer first (``value=0.5``
adds nothing), and ``value * t1 * t2`` is one expression, where the rewrite rounds ``t1 * t2``
first and multiplies in another order.

``restore_inplace_updates`` puts ``addcmul_``/``addcdiv_`` back as the user wrote them (their
decompositions then compute as eager's kernels do, and ``overlap.refuses_inplace_cast`` sees
their result type) and an ``add_`` whose tensor ``alpha`` eager refuses, which then runs
eagerly to raise eager's error (as does an integer ``addcdiv_``).
"""

from __future__ import annotations

from typing import Any

import torch

_fma = torch.ops.prims.fma.default
# the op Dynamo computed the fma's first operand with, and the update it replaced
_RESTORED = {torch.mul: "addcmul_", torch.div: "addcdiv_"}


def restore_inplace_updates(gm: torch.fx.GraphModule) -> bool:
    """Undo Dynamo's fma rewrites in ``gm`` (see the module's doc). True where the graph now holds
    an update eager refuses (an ``add_``'s tensor ``alpha``, an integer ``addcdiv_``): it must run
    eagerly, which raises eager's error."""
    refused, changed = False, False
    for fma in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is _fma]:
        copy = next(iter(fma.users), None)
        if len(fma.users) != 1 or copy.op != "call_method" or copy.target != "copy_" \
                or len(fma.args) != 3 or copy.args != (fma.args[2], fma):
            continue
        first, value, written = fma.args
        if not isinstance(first, torch.fx.Node) or not isinstance(written, torch.fx.Node):
            continue
        number = isinstance(value, (bool, int, float)) or _symbolic_number(value)
        if isinstance(value, torch.fx.Node) and not number:
            # add_(y, alpha=tensor): restored only where eager refuses it
            if not _refuses_tensor_alpha(_example(written), _example(first), _example(value)):
                continue
            refused = True
            method, args, kwargs = "add_", (written, first), {"alpha": value}
        elif number and first.target in _RESTORED and len(first.users) == 1 \
                and len(first.args) == 2 and not first.kwargs:
            # (a ``value`` Dynamo made symbolic, a Python number that changed between calls, too:
            # an integer addcmul_ truncates it as it does a literal one)
            method, args, kwargs = _RESTORED[first.target], (written, *first.args), {"value": value}
            # (eager refuses integer addcdiv_; so do torch's meta functions, while tracing)
            refused |= method == "addcdiv_" and all(_integer(_example(a)) for a in first.args)
        else:
            continue
        with gm.graph.inserting_before(copy):
            update = gm.graph.call_method(method, args, kwargs)
        update.meta.update(copy.meta)
        copy.replace_all_uses_with(update)
        gm.graph.erase_node(copy)
        gm.graph.erase_node(fma)
        if first.op == "call_function" and first.target in _RESTORED and not first.users:
            gm.graph.erase_node(first)
        changed = True
    if changed:
        gm.recompile()
    return refused


def _example(node: torch.fx.Node) -> Any:
    return node.meta.get("example_value")


def _symbolic_number(value: Any) -> bool:
    """A node standing for a Python number (a SymInt, SymFloat or SymBool Dynamo made of it)."""
    return isinstance(value, torch.fx.Node) and isinstance(_example(value),
                                                            (torch.SymInt, torch.SymFloat, torch.SymBool))


def _integer(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and not (t.dtype.is_floating_point or t.dtype.is_complex)


def _refuses_tensor_alpha(x: Any, y: Any, alpha: Any) -> bool:
    """Does eager refuse ``x.add_(y, alpha=alpha)``? Its argument parser takes a 0-d tensor that
    does not require grad as the number ``alpha`` only (even under no_grad); its ``alpha_check``
    refuses a bool alpha but for bool results, a float one for integer results and a complex one
    for real results; the in-place write refuses a result type that cannot be cast to ``x``'s
    dtype."""
    if not all(isinstance(t, torch.Tensor) for t in (x, y, alpha)):
        return False
    if alpha.dim() != 0 or alpha.requires_grad:  # (the parser takes no tensor needing grad as a number)
        return True
    dtype = torch.result_type(x, y)
    if alpha.dtype == torch.bool and dtype != torch.bool:
        return True
    if alpha.dtype.is_floating_point and not (dtype.is_floating_point or dtype.is_complex):
        return True
    if alpha.dtype.is_complex and not dtype.is_complex:
        return True
    return not torch.can_cast(dtype, x.dtype)
