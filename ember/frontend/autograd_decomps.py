"""Ops torch decomposes at the Autograd dispatch key, as eager computes them.

torch installs its decompositions of a few ops at the Autograd key, so AOTAutograd traces them
before any decomposition table is read (ember's table never sees these ops), and some differ from
ATen's kernels:

* ``multi_margin_loss`` and ``multilabel_margin_loss_forward``: ATen adds a class's term only
  where ``z = margin - x[target] + x[j] > 0``. ``clamp_min(z, 0)`` has a gradient of 1 at
  ``z = 0`` (a class exactly at the margin got a gradient eager's kernel gives it not), and a
  NaN ``z`` made the loss NaN where eager leaves the term out. multilabel's decomposition also
  added the terms of target slots after the list's first -1 (each with the input of class 0):
  wrong losses and gradients for any row with fewer targets than classes.

``one_hot`` (torch 2.13 decomposes it at CompositeImplicitAutograd, in Python): the decomposition
drops eager's checks that the classes are int64 (an int32 tensor of expert ids gave a one-hot
where eager raises) and that an empty tensor has a positive number of classes.
``check_one_hot_dtype()`` adds them to it for the life of the process (Dynamo runs it on fake
tensors before any backend is called; the checks only raise eager's errors).

``_log_softmax`` of an empty integer or bool tensor: eager returns an empty tensor of its
dtype, and so does its decomposition for integers, but a bool one refused the subtraction of bools
(eager's is NotImplementedError where the tensor has elements). Dynamo runs that decomposition on
fake tensors, before any backend is called: ``empty_log_softmax_of_bools()`` gives it eager's
result for the life of the process.

``split`` of an empty dim: torch 2.11's decomposition (which fake tensors run where the tensor
has a symbolic size) made no chunk and indexed the empty list of chunk sizes, so
``x.split(1, dim=1)`` of a (B, 0, C) tensor failed Dynamo's trace with an IndexError, where eager
returns the one empty chunk. ``one_chunk_of_an_empty_dim()`` returns it, as torch 2.13 does.

``linalg_vector_norm`` over dims all of size 1, named from the end (``dim=-2``): torch 2.11's
meta function (its reference, which fake tensors run) kept those dims, their negative numbers
never matching a position, so Dynamo traced a (127, 1, 7) result where eager's is (127, 7):
ember ran the graph through ATen with a warning, or an op after it (an expand) raised where
eager runs. ``vector_norm_dims_from_the_front()`` numbers them from the front first, as torch
2.13's reference does. ``split`` and ``split_with_sizes`` of a 0-d tensor: their references
indexed its shape (IndexError, torch 2.11 and 2.13) where eager raises RuntimeError.

``softshrink``: torch's decomposition computes the band as ``a * 0`` (a NaN input stays NaN),
whose gradient ``g * 0`` is NaN for a NaN or infinite incoming ``g``; eager's is 0 there. Its
value there is -0.0 for a negative input, where eager's CUDA kernel and its vectorized CPU one
give +0.0 (only the CPU kernel's scalar tail, the last elements of a row shorter than a vector,
gives -0.0): ember's band is +0.0, a NaN kept. eager's CPU kernel compares a 16-bit input with
``lambd`` in float32, its CUDA kernel compares with and subtracts ``lambd`` rounded to the
input's dtype, as ember on each. (eager's CPU backward compares in the input's dtype, so a
bfloat16 -0.2002 gets no gradient there though its forward moved it: ember's gradient follows its
forward, as float64's does.) A NaN input's gradient is 0 on the CPU, as eager's vectorized
kernel gives it, where its scalar tail passes the incoming one (eager has no one answer there); on
a GPU the incoming one, as eager's CUDA kernel gives it.

``hardshrink``: a NaN input's gradient is 0 on the CPU, as for softshrink (eager's CUDA kernel
passes the incoming one on, as torch's decomposition does). torch's decomposition computed
integer and bool inputs, which eager's kernel refuses (NotImplementedError), and a ``lambd`` out
of the input dtype's range, which eager's kernel converts with its overflow check
(RuntimeError); such calls keep the op for ATen to refuse (a symbolic ``lambd``, a value that
changed between calls, is checked on each call: aten_scalars.py).

``eager_decompositions()`` puts the versions below in their place while AOTAutograd traces
(and random_decomps.py's dropout and bernoulli_, which draw what eager's kernels draw, and
before torch 2.13 cumprod_grad.py's gradient of cumprod, and prod_grad.py's of 16-bit CPU products).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch._C import DispatchKey
from torch._decomp import decomposition_table

from .aten_scalars import checked_value, rounded_16, scalar_fits
from .bag_decomps import bag_overrides
from .cumprod_grad import cumprod_override
from .layout_decomps import layout_overrides
from .pool_dtypes import pool_overrides
from .prod_grad import prod_override
from .random_decomps import dropout_overrides, functional_bernoulli

aten = torch.ops.aten

_MEAN, _SUM = 1, 2  # torch's Reduction enum (0 is "none")


def multi_margin_loss(input: torch.Tensor, target: torch.Tensor, p: Any = 1, margin: Any = 1,
                      weight: torch.Tensor | None = None, reduction: int = _MEAN) -> torch.Tensor:
    """``aten.multi_margin_loss``: torch's decomposition with eager's ``z > 0`` test."""
    # eager's autograd has no formula for the weight (it raises before computing anything); the
    # decomposition, differentiable in it, gave the weight a gradient
    torch._check(weight is None or not (weight.requires_grad and torch.is_grad_enabled()),
                 lambda: "The function 'multi_margin_loss' is not differentiable with respect to argument "
                         "'weight'. This input cannot have requires_grad True.")
    if _no_cpu_kernel(input):
        return _aten(aten.multi_margin_loss.default, input, target, p, margin, weight, reduction)
    one_sample = target.ndim == 0  # (eager: then a 0-d loss)
    input = torch.atleast_2d(input)
    target = torch.atleast_1d(target)
    nframe, dim = input.shape[0], input.shape[1]
    torch._check(p == 1 or p == 2, lambda: "only p == 1 and p == 2 supported")
    torch._check(input.ndim == 2 and dim != 0,
                 lambda: f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {input.shape}")
    torch._check(target.ndim == 1 and target.numel() == nframe,
                 lambda: f"inconsistent target size, expected {nframe} but got {target.shape}")
    if weight is not None:
        weight = torch.atleast_1d(weight)
        torch._check(weight.ndim == 1 and weight.numel() == dim,
                     lambda: f"inconsistent weight size, expected {dim} but got {weight.shape}")
    target = target.unsqueeze(1)
    u = torch.gather(input, dim=1, index=target)
    z = margin - u + input
    z = torch.where(z > 0, z, 0)  # (eager: a term at or below the margin, or NaN, adds nothing)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * weight[target]
    idx = torch.arange(dim, device=input.device)
    z = torch.where(idx != target, z, 0)
    if reduction == _MEAN:
        return z.mean()
    if reduction == _SUM:
        return z.sum() / z.shape[1]
    return z.mean(dim=1).reshape(()) if one_sample else z.mean(dim=1)


def multilabel_margin_loss_forward(input: torch.Tensor, target: torch.Tensor,
                                   reduction: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``aten.multilabel_margin_loss_forward``: each row's targets are its target list up to the
    first -1; every pair (target k, non-target j) adds ``max(0, 1 - x[k] + x[j]) / C`` where
    positive, as eager's kernel."""
    if _no_cpu_kernel(input):
        return _aten(aten.multilabel_margin_loss_forward.default, input, target, reduction)
    input_shape, target_shape = input.shape, target.shape
    input = torch.atleast_2d(input)
    target = torch.atleast_2d(target)
    dim = input.shape[1]
    torch._check(len(input_shape) <= 2 and dim != 0,
                 lambda: f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: {input_shape}")
    torch._check(len(target_shape) <= 2 and target_shape == input_shape,
                 lambda: f"inconsistent target size: {target_shape} for input of size: {input_shape}")
    idx = torch.arange(dim, device=target.device)
    end = torch.amin(torch.where(target == -1, idx, dim), dim=-1, keepdim=True)
    in_list = idx < end  # (N, slot): the slots before the first -1
    u = torch.gather(input, dim=-1, index=torch.where(in_list, target, 0))  # (N, slot)
    is_target = torch.any(idx == torch.where(in_list, target, -1).unsqueeze(-1), dim=1)  # (N, class)
    z = 1.0 - u.unsqueeze(-1) + input.unsqueeze(1)  # (N, slot, class)
    counted = (z > 0) & in_list.unsqueeze(-1) & ~is_target.unsqueeze(1)
    z = torch.where(counted, z, 0) / dim
    if reduction == _MEAN:
        loss = z.sum(dim=(1, 2)).mean()
    elif reduction == _SUM:
        loss = z.sum()
    else:
        loss = z.sum(dim=(1, 2))
        if len(input_shape) <= 1:
            loss = loss.reshape(())  # (eager: a 0-d loss for one sample)
    return loss, is_target.to(input.dtype).reshape(target_shape)


def _no_cpu_kernel(input: torch.Tensor) -> bool:
    """Eager's CPU kernels take float32 and float64 only (its GPU ones 16-bit floats too)."""
    return input.device.type == "cpu" and input.dtype not in (torch.float32, torch.float64)


def _aten(op: Any, *args: Any) -> Any:
    """``op`` itself in the graph, which ATen runs (and refuses, as eager does)."""
    with torch._C._AutoDispatchBelowAutograd():
        return op(*args)


def in_table(decomposition: Any) -> Any:
    """``decomposition`` for a decomposition table (an inference_mode trace reads it), where an op
    eager has no kernel for stays the op (NotImplemented) for ATen to refuse."""
    def decompose(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return NotImplemented if _no_cpu_kernel(input) else decomposition(input, *args, **kwargs)
    return decompose


def _hardshrink_refused(x: torch.Tensor, lambd: Any) -> bool:
    return not x.dtype.is_floating_point or isinstance(lambd, (int, float)) and not scalar_fits(lambd, x.dtype)


def hardshrink(x: torch.Tensor, lambd: Any = 0.5) -> torch.Tensor:
    """``aten.hardshrink``: torch's decomposition, or the op where eager's kernel refuses."""
    if _hardshrink_refused(x, lambd):
        return _aten(aten.hardshrink.default, x, lambd)
    # (a symbolic lambd, checked each call as eager converts it: float16's 7e4 raises)
    lambd = checked_value(lambd, x.dtype, "hardshrink", "lambd")
    if x.device.type == "cpu":  # (a NaN's gradient 0, as eager's vectorized CPU kernel gives it)
        return torch.where(torch.abs(x) > lambd, x, torch.where(torch.abs(x) <= lambd, 0, x.detach()))
    return torch.where(torch.abs(x) <= lambd, 0, x)


def hardshrink_in_table(x: torch.Tensor, lambd: Any = 0.5) -> Any:
    """hardshrink for a decomposition table: NotImplemented (the op stays) where eager refuses."""
    return NotImplemented if _hardshrink_refused(x, lambd) else hardshrink(x, lambd)


def softshrink(a: torch.Tensor, lambd: Any = 0.5) -> torch.Tensor:
    """``aten.softshrink``: torch's decomposition with eager's gradient, 0 inside the band
    whatever the incoming gradient. torch's ``a * 0`` there (a NaN input stays NaN) passed a NaN
    or infinite incoming gradient on as NaN: an RMSNorm's weight with a NaN made every row's
    shrunk elements NaN where eager's are 0 (GPU fuzz seed 48235966367, CPU alike)."""
    torch._check(0 <= lambd <= torch.finfo(a.dtype).max,
                 lambda: f"lambda must be in range [0, {torch.finfo(a.dtype).max}] for input dtype {a.dtype}, "
                         f"but found {lambd}")
    on_cpu = a.device.type == "cpu"
    # (eager's CPU kernel computes 16-bit floats in float32, against lambd in float32: a
    # bfloat16 -0.2002 is outside a band of 0.2 there, inside it on a GPU, whose kernel rounds
    # lambd to the input's dtype)
    x = a.float() if on_cpu and a.dtype.itemsize == 2 else a
    if not on_cpu and a.dtype in (torch.float16, torch.bfloat16):
        # (torch's decomposition left lambd unrounded, which the comparison and the subtraction,
        # computed in float32, used as it is: a float16 softshrink(x, 0.3) differed from eager's
        # by an ulp in 713 of 4096 elements on an H100. A symbolic lambd, one that changed between
        # calls, is rounded on the device.)
        lambd = (rounded_16(float(lambd), a.dtype) if isinstance(lambd, (int, float))
                 else torch.scalar_tensor(lambd, dtype=a.dtype, device=a.device))
    outside = torch.abs(x) > lambd
    if not on_cpu:  # (eager's CUDA kernel passes a NaN's gradient on)
        outside = outside | torch.isnan(x)
    # the band is +0.0 (a NaN stays NaN), as eager's CUDA and vectorized CPU kernels give it:
    # torch's ``a * 0`` made -0.0 of a negative input, which atan2, a division or copysign
    # after it turned into the other sign (eager's CPU scalar tail alone does that)
    band = torch.where(torch.isnan(x), x.detach(), 0.0)
    return torch.where(outside, x - torch.sign(x) * lambd, band).to(a.dtype)


_OVERRIDES = {aten.multi_margin_loss.default: multi_margin_loss,
              aten.multilabel_margin_loss_forward.default: multilabel_margin_loss_forward,
              aten.hardshrink.default: hardshrink, aten.softshrink.default: softshrink}


@contextlib.contextmanager
def eager_decompositions(cpu_embedding_bag: bool = False) -> Iterator[None]:
    """While AOTAutograd traces: the ops above in place of torch's Autograd-key decompositions
    (restored after, so other backends in the process keep torch's)."""
    overrides = [(op, DispatchKey.Autograd, fn) for op, fn in _OVERRIDES.items()]
    # (global average pooling of channels_last tensors without ATen's as_strided_: layout_decomps.py)
    overrides += [(op, DispatchKey.CompositeImplicitAutograd, fn) for op, fn in layout_overrides().items()]
    # (embedding_bag's sum and mean as segment reductions: bag_decomps.py)
    bags = bag_overrides(cpu_embedding_bag)
    overrides += [(op, DispatchKey.CompositeImplicitAutograd, fn) for op, fn in bags.items()]
    # (dropout drawing only where eager's kernel draws: random_decomps.py)
    overrides += [(op, key, fn) for (op, key), fn in dropout_overrides().items()]
    # (max_pool1d and upsampling of integers refused or computed as eager's: pool_dtypes.py)
    overrides += pool_overrides()
    # (cumprod's gradient in scans, where torch traces it element by element: cumprod_grad.py)
    overrides += cumprod_override()
    # (a 16-bit CPU product's gradient from ATen's rounded result, as eager's: prod_grad.py)
    overrides += prod_override()
    saved = []
    for op, key, fn in overrides:
        saved.append((op, key, op.py_kernels.get(key)))
        op.py_kernels[key] = fn
        op._dispatch_cache.clear()
    try:
        with functional_bernoulli():  # (bernoulli_ in its tensor's memory order)
            yield
    finally:
        for op, key, fn in saved:
            if fn is None:
                op.py_kernels.pop(key, None)
            else:
                op.py_kernels[key] = fn
            op._dispatch_cache.clear()


def check_one_hot_dtype() -> None:
    """Give torch's Python decomposition of ``one_hot`` (where it has one) eager's checks: classes
    that are not int64, or no classes for an empty tensor, are eager's RuntimeError. Once per
    process."""
    op = aten.one_hot.default
    decomposition = op.py_kernels.get(DispatchKey.CompositeImplicitAutograd)
    if decomposition is None or getattr(decomposition, "_ember_checks_dtype", False):
        return

    def one_hot(self: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
        torch._check(self.dtype == torch.int64,
                     lambda: f"one_hot is only applicable to index tensor of type LongTensor (got {self.dtype}).")
        # (eager's kernel: no classes to give an empty tensor; the decomposition made a (..., 0) one)
        torch._check(num_classes > 0 or self.numel() != 0,
                     lambda: "Can not infer total number of classes from empty tensor.")
        return decomposition(self, num_classes)

    one_hot._ember_checks_dtype = True  # type: ignore[attr-defined]
    op.py_kernels[DispatchKey.CompositeImplicitAutograd] = one_hot
    op._dispatch_cache.clear()


check_one_hot_dtype()


def empty_log_softmax_of_bools() -> None:
    """Give torch's decomposition of ``_log_softmax``, which fake tensors run, eager's empty
    result for an empty bool tensor. Once per process."""
    op = aten._log_softmax.default
    decomposition = decomposition_table.get(op)
    if decomposition is None or getattr(decomposition, "_ember_empty_bools", False):
        return

    # (wraps: fake tensors run a table entry only where its name and module are torch's own)
    @functools.wraps(decomposition)
    def log_softmax(x: torch.Tensor, dim: int, half_to_float: bool, **kwargs: Any) -> torch.Tensor:
        if x.dtype == torch.bool and x.numel() == 0 and not kwargs:
            return torch.empty_like(x, memory_format=torch.contiguous_format)
        return decomposition(x, dim, half_to_float, **kwargs)

    log_softmax._ember_empty_bools = True  # type: ignore[attr-defined]
    decomposition_table[op] = log_softmax


empty_log_softmax_of_bools()


def _corrected(op: Any, flag: str, correct: Any) -> None:
    """Install ``correct(reference)`` in place of torch's meta function and decomposition of
    ``op`` (fake tensors run one or the other, as the dispatch goes), each once per process."""
    def install(reference: Any) -> Any:
        # (wraps: fake tensors run a table entry only where its name and module are torch's own)
        wrapper = functools.wraps(reference)(correct(reference))
        setattr(wrapper, flag, True)
        return wrapper

    meta = op.py_kernels.get(DispatchKey.Meta)
    if meta is not None and not getattr(meta, flag, False):
        op.py_kernels[DispatchKey.Meta] = install(meta)
        op._dispatch_cache.clear()
    decomposition = decomposition_table.get(op)
    if decomposition is not None and not getattr(decomposition, flag, False):
        decomposition_table[op] = install(decomposition)


def vector_norm_dims_from_the_front() -> None:
    """Give torch's reference of ``linalg_vector_norm`` its dims numbered from the front (torch
    2.11 kept a negative one of size 1)."""
    def correct(reference: Any) -> Any:
        def vector_norm(x: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
            if isinstance(dim, (list, tuple)) and x.dim() > 0 and all(-x.dim() <= d < x.dim() for d in dim):
                dim = [d % x.dim() for d in dim]  # (a dim out of range: torch's own check raises)
            return reference(x, ord, dim, keepdim, **kwargs)
        return vector_norm

    _corrected(aten.linalg_vector_norm.default, "_ember_dims_from_the_front", correct)


def one_chunk_of_an_empty_dim() -> None:
    """Give torch's decomposition of ``split`` eager's one chunk of an empty dim (torch 2.11
    raised IndexError) and eager's RuntimeError for a 0-d tensor (an IndexError in 2.11 and
    2.13)."""
    def correct(reference: Any) -> Any:
        def split(self: torch.Tensor, split_size: Any, dim: int = 0) -> Any:
            torch._check(self.dim() > 0, lambda: "split expects at least a 1-dimensional tensor")
            size = self.shape[dim] if -self.dim() <= dim < self.dim() else None
            if isinstance(size, int) and size == 0 and isinstance(split_size, int) and split_size > 0:
                return (self.detach(),)  # (negative sizes, bad dims: torch's own checks raise)
            return reference(self, split_size, dim)
        return split

    _corrected(aten.split.Tensor, "_ember_empty_dim", correct)


def split_with_sizes_of_a_0d_tensor_refused() -> None:
    """Give torch's reference of ``split_with_sizes`` eager's RuntimeError for a 0-d tensor (it
    indexed the tensor's shape: an IndexError)."""
    def correct(reference: Any) -> Any:
        def split_with_sizes(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            torch._check(self.dim() > 0, lambda: "split expects at least a 1-dimensional tensor")
            return reference(self, *args, **kwargs)
        return split_with_sizes

    _corrected(aten.split_with_sizes.default, "_ember_refuses_0d", correct)


one_chunk_of_an_empty_dim()
vector_norm_dims_from_the_front()
split_with_sizes_of_a_0d_tensor_refused()
