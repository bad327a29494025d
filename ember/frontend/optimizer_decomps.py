"""Decompositions of the ops optimizer steps trace into, so that their arithmetic fuses.

* ``aten._foreach_*``: an optimizer with ``foreach=True`` (the default on GPUs),
  ``clip_grad_norm_`` and ``clip_grad_value_`` update lists of tensors with one op per list.
  ember has no list ops: each ran through ATen, and a whole compiled step became ATen calls. Each
  is split into its op per tensor, as eager's CPU kernels compute it (``t.add(other, alpha)`` for
  each ``t``); the pointwise ops over one tensor then fuse, and functionalization's copies write
  the results back as it does for the list op.
* ``prims.fma``: Dynamo rewrites ``addcmul_``/``addcdiv_`` with a ``value`` and ``add_`` with a
  tensor ``alpha`` into it (every Adam, RMSprop, Adagrad step); it ran through ATen.
* ``aten.add``/``aten.sub`` with a symbolic float ``alpha`` (SGD's ``param.add_(grad,
  alpha=-lr)``): torch's pass that turns float arguments into 0-d tensors reads only positional
  arguments, so it specialized on the keyword ``alpha`` and each new learning rate recompiled.
  Each call's alpha is checked as eager converts it, to the result's dtype on the CPU, its op math
  type on GPUs (aten_scalars.py).
* GradScaler's ``_amp_foreach_non_finite_check_and_unscale_`` and ``_amp_update_scale_``: a pass
  over every gradient, and the scale's update, ran through ATen; they are written out as eager's
  kernels compute them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes, get_computation_dtype

from .aten_scalars import checked_symbolic

aten = torch.ops.aten

# List ops with no one-op-per-tensor form ember generates: the addcmul/addcdiv overloads whose
# per-tensor values come in one tensor (eager reads them on the host), matmuls, and powsum.
_KEPT = {"addcmul.Tensor", "addcdiv.Tensor", "mm.default", "powsum.Scalar"}


def optimizer_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions above, keyed by op overload."""
    table: dict[Any, Callable[..., Any]] = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::_foreach_") or schema.name.endswith("_") \
                or schema.overload_name.endswith("out"):
            continue  # (in-place variants are functionalized into these before decomposing)
        short, overload = schema.name[len("aten::_foreach_"):], schema.overload_name or "default"
        per_tensor = _PER_TENSOR.get(f"{short}.{overload}") or _PER_TENSOR.get(short) or getattr(aten, short, None)
        if f"{short}.{overload}" in _KEPT or per_tensor is None:
            continue
        op = getattr(getattr(aten, f"_foreach_{short}"), overload)
        table[op] = _over_lists(op, per_tensor)
    table[torch.ops.prims.fma.default] = _fma
    table[aten._amp_foreach_non_finite_check_and_unscale.default] = _amp_unscale
    table[aten._amp_update_scale.default] = _amp_update_scale
    for op in (aten.add.Tensor, aten.sub.Tensor):
        table[op] = functools.partial(_add_sub_symbolic_alpha, op)
    return table


def _norm(x: torch.Tensor, ord: Any = 2, dtype: Any = None) -> torch.Tensor:
    return aten.linalg_vector_norm(x, ord, None, False, dtype=dtype)


def _addcmul(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: Any = 1) -> torch.Tensor:
    return aten.addcmul(x, t1, t2, value=value)


def _addcdiv(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: Any = 1) -> torch.Tensor:
    return aten.addcdiv(x, t1, t2, value=value)


# per-tensor ops whose name or arguments differ from the list op's (its value is positional;
# maximum and minimum take no scalar: eager's list kernels clamp)
_PER_TENSOR: dict[str, Callable[..., Any]] = {
    "norm": _norm, "addcmul": _addcmul, "addcdiv": _addcdiv,
    "maximum.Scalar": aten.clamp_min, "maximum.ScalarList": aten.clamp_min,
    "minimum.Scalar": aten.clamp_max, "minimum.ScalarList": aten.clamp_max,
}


def _over_lists(op: Any, per_tensor: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` as ``per_tensor`` applied to the i-th element of each list argument (and the
    other arguments as they are), for each i."""
    arguments = op._schema.arguments
    is_list = [str(a.type) in ("List[Tensor]", "List[number]") for a in arguments]

    @functools.wraps(per_tensor)
    def decompose(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        positional, keywords = [], {}
        for i, a in enumerate(arguments):
            if i < len(args):
                value = args[i]
            elif a.name in kwargs:
                value = kwargs[a.name]
            else:
                value = a.default_value
            (keywords.__setitem__(a.name, value) if a.kwarg_only else positional.append(value))
        lists = [v for v, listed in zip(positional, is_list) if listed]
        n = len(lists[0])
        return [per_tensor(*[v[i] if listed else v for v, listed in zip(positional, is_list)], **keywords)
                for i in range(n)]

    return decompose


def _fma(a: Any, b: Any, c: Any) -> torch.Tensor:
    """``a * b + c``, computed as eager computes the op Dynamo replaced (``addcmul_``'s 16-bit
    tensors in float32, rounded once at the end), where the prim's own definition rounds the
    product to 16 bits first."""
    _, dtype = elementwise_dtypes(a, b, c, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    compute = get_computation_dtype(dtype)
    wide = [x.to(compute) if isinstance(x, torch.Tensor) and x.dtype != compute and compute != dtype else x
            for x in (a, b, c)]
    out = aten.add.Tensor(aten.mul.Tensor(wide[0], wide[1]), wide[2])
    return out.to(dtype) if out.dtype != dtype else out


def _add_sub_symbolic_alpha(op: Any, a: Any, b: Any, *, alpha: Any = 1) -> Any:
    """``a + b * alpha`` where ``alpha`` is a symbolic float: the product then takes the float
    as a 0-d tensor, and ember computes it as it computes add's alpha (rounded to 16 bits for a
    16-bit result on CPUs, as eager's vectorized kernel rounds it). Anything else stays the op
    (integer results refuse a float alpha, as the op does)."""
    if not isinstance(alpha, torch.SymFloat) or not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return NotImplemented
    _, dtype = elementwise_dtypes(a, b, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    if dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        return NotImplemented
    scaled = aten.mul.Tensor(b, alpha)
    out = aten.add.Tensor(a, scaled) if op is aten.add.Tensor else aten.sub.Tensor(a, scaled)
    # (eager converts alpha with its overflow check, on the CPU to the result's dtype, on GPUs to
    # its op math type's: each call's value is checked, aten_scalars.py; a float16 alpha of 7e4
    # gave inf on the CPU)
    into = dtype if out.device.type == "cpu" else get_computation_dtype(dtype)
    return checked_symbolic(out, alpha, into, "add" if op is aten.add.Tensor else "sub", "alpha")


def _one_float32(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel() == 1


def _amp_unscale(grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> Any:
    """Each gradient times ``inv_scale`` (16-bit ones in float32, rounded once), and ``found_inf``
    set to 1 where any element of any gradient is inf or NaN (else left as it was). Arguments
    eager's kernel refuses keep the op, which raises as eager does."""
    if not (_one_float32(found_inf) and _one_float32(inv_scale)) or \
            any(not g.is_floating_point() or g.device != found_inf.device for g in grads):
        return NotImplemented
    scale = aten.view.default(inv_scale, [])  # (a (1,) tensor would broadcast a 0-d gradient)
    out, nonfinite = [], []
    for g in grads:
        wide = g.to(get_computation_dtype(g.dtype))
        out.append(aten.mul.Tensor(wide, scale).to(g.dtype))
        nonfinite.append(aten.any.default(aten.logical_not.default(aten.isfinite.default(g))))
    if not nonfinite:
        return out, aten.clone.default(found_inf)
    seen = functools.reduce(aten.logical_or.default, nonfinite)
    return out, aten.where.self(seen, aten.ones_like.default(found_inf), found_inf)


def _amp_update_scale(scale: torch.Tensor, growth_tracker: torch.Tensor, found_inf: torch.Tensor,
                      growth_factor: float, backoff_factor: float, growth_interval: int) -> Any:
    """GradScaler's update: after an inf or NaN the scale backs off and the count of good steps
    restarts; after ``growth_interval`` good steps it grows (unless it would overflow). The
    products are taken in float64 and rounded to float32, as eager's kernel does."""
    if not (_one_float32(scale) and _one_float32(found_inf)) or growth_tracker.dtype != torch.int32 \
            or growth_tracker.numel() != 1:
        return NotImplemented
    found = aten.ne.Scalar(found_inf, 0)  # (a NaN counts, as eager's `if (*found_inf)`)
    wide = scale.to(torch.float64)
    backed = aten.mul.Tensor(wide, backoff_factor).to(torch.float32)
    grown = aten.mul.Tensor(wide, growth_factor).to(torch.float32)
    grown = aten.where.self(aten.isfinite.default(grown), grown, scale)
    successful = aten.add.Tensor(growth_tracker, 1)
    grow = aten.eq.Scalar(successful, growth_interval)
    zero = aten.zeros_like.default(growth_tracker)
    new_scale = aten.where.self(found, backed, aten.where.self(grow, grown, scale))
    new_tracker = aten.where.self(found, zero, aten.where.self(grow, zero, successful))
    return new_scale, new_tracker
