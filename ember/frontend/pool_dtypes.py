"""Pooling and upsampling of integer and bool tensors, refused or computed as eager's kernels do.

torch decomposes ``max_pool1d`` and ``F.interpolate``'s upsampling ops while AOTAutograd traces
(at the Autograd key, before ember's decomposition table is read) into ops that compute any
dtype, so ember computed where eager raises NotImplementedError:

* ``max_pool1d`` of integers or bools on the CPU: eager's composite takes its own kernel there
  ('"max_pool1d_impl" not implemented for 'Int''), which has floating types only. Under tracing
  it takes the path with indices (a fake tensor counts as a subclass), whose max_pool2d takes
  integers. The traced result passes through ``ember::refused``, which raises eager's error when
  the program runs. (With indices eager computes integers on the CPU too; on GPUs it takes the
  path with indices itself, whose max_pool2d ATen runs, refusing integers as eager's does.)
* ``F.interpolate`` (the ``upsample_*`` ops) of integers or bools: eager's CPU kernels have
  floating types, and uint8 for nearest, nearest-exact, bilinear and bicubic (bilinear's and
  bicubic's uint8 kernels round their own way, which the decompositions did not: other values).
  Such calls keep ATen's op, which raises eager's error or computes eager's values, on any
  device; uint8 nearest and nearest-exact (a gather, exact) stay decomposed. (linear, trilinear
  and area refuse uint8 too; area is an adaptive average pool, which ATen runs already.)
* ``F.interpolate`` of an input with no channels or no pixels: eager's kernels raise
  RuntimeError, the decompositions returned an empty result. ATen's op is kept, and its check
  raises eager's error while the graph is traced (the call then runs eagerly and raises it).

``pool_overrides()`` gives the kernels to use while AOTAutograd traces (autograd_decomps.py puts
them in place), ``kept_upsampling(table)`` the decomposition table's entries that keep the ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DispatchKey

from .dtype_refusals import _dtype_name
from .linear_upsampling import upsample_linear_vec

aten = torch.ops.aten

_NEAREST = (aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
            aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d)
_LINEAR = (aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d)
_INTERPOLATING = (aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_bicubic2d,
                  aten.upsample_trilinear3d, aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa)


@torch.library.custom_op("ember::refused", mutates_args=())
def refused(result: torch.Tensor, message: str) -> torch.Tensor:
    """Eager's NotImplementedError ``message`` (no kernel for the dtype), raised where a
    decomposition computed ``result``."""
    raise NotImplementedError(message)


@refused.register_fake
def _refused_fake(result: torch.Tensor, message: str) -> torch.Tensor:
    return torch.empty_like(result)


def _max_pool1d(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """max_pool1d as ATen's composite computes it under tracing (its arguments checked as
    eager's), refused where eager's CPU composite takes its floating-only kernel."""
    out = aten.max_pool1d.default._op_dk(DispatchKey.CompositeImplicitAutograd, x, *args, **kwargs)
    if x.device.type == "cpu" and not x.dtype.is_floating_point and not x.requires_grad:
        return torch.ops.ember.refused(out, f"\"max_pool1d_impl\" not implemented for '{_dtype_name(x.dtype)}'")
    return out


def _kept(packet: Any, x: Any) -> bool:
    """Does ATen's own upsampling op decide for ``x`` (an integer or bool tensor, but a uint8
    one of a nearest mode)?"""
    if isinstance(x, torch.Tensor) and any(type(n) is int and n == 0 for n in x.shape[1:]):
        return True  # (no channels or no pixels: eager's kernels refuse it, the decompositions did not)
    if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype.is_complex:
        return False
    return not (packet in _NEAREST and x.dtype == torch.uint8)


def _upsample(op: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """torch's kernel ``original`` of ``op`` (at a dispatch key), except where ATen's op decides: then a
    ``.vec`` overload runs ATen's C++ composite (its output size, then the ``.default`` op) and
    a ``.default`` one is traced as the op itself."""
    packet = op.overloadpacket

    def upsample(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not _kept(packet, x):
            return original(x, *args, **kwargs)
        if op._overloadname == "vec":
            return op._op_dk(DispatchKey.CompositeImplicitAutograd, x, *args, **kwargs)
        with torch._C._AutoDispatchBelowAutograd():  # (no gradient: integers and bools have none)
            return op(x, *args, **kwargs)
    return upsample


def pool_overrides() -> list[tuple[Any, DispatchKey, Callable[..., Any]]]:
    """(op, dispatch key, kernel) to put in place of torch's while AOTAutograd traces."""
    out: list[tuple[Any, DispatchKey, Callable[..., Any]]] = [
        (aten.max_pool1d.default, DispatchKey.CompositeImplicitAutograd, _max_pool1d)]
    for packet in (*_NEAREST, *_INTERPOLATING):
        for name in ("vec", "default"):
            op = getattr(packet, name)
            for key in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd):
                original = _torch_kernels().get((op, key))
                if original is not None and packet in _LINEAR and name == "vec":
                    original = upsample_linear_vec  # (neighbours weighted as eager's: linear_upsampling.py)
                if original is not None:
                    out.append((op, key, _upsample(op, original)))
    return out


def kept_upsampling(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    """The decomposition table's upsampling entries, keeping the op where ATen's decides."""
    out = {}
    for packet in (*_NEAREST, *_INTERPOLATING):
        for op in (packet.vec, packet.default):
            if op in table:
                out[op] = _keeping(table[op], packet)
    return out


def _keeping(decomposition: Callable[..., Any], packet: Any) -> Callable[..., Any]:
    def decompose(x: Any, *args: Any, **kwargs: Any) -> Any:
        return NotImplemented if _kept(packet, x) else decomposition(x, *args, **kwargs)
    return decompose


@functools.cache
def _torch_kernels() -> dict[tuple[Any, DispatchKey], Callable[..., Any] | None]:
    """torch's own Python kernels of the upsampling ops, read once, before any override is in
    place (the overrides call them)."""
    return {(getattr(p, name), key): getattr(p, name).py_kernels.get(key)
            for p in (*_NEAREST, *_INTERPOLATING) for name in ("vec", "default")
            for key in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)}
