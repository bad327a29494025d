"""The decomposition table AOTAutograd traces with: core ATen's, ember's own (losses, norms,
pooling, optimizers, special functions), and the conditions under which an op stays whole
because eager's kernel refuses, rounds or overflows where its decomposition would not."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._decomp import core_aten_decompositions, get_decompositions
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.fx.experimental.symbolic_shapes import guard_or_true

from ..ir import dtypes as dt
from .aten_scalars import range_checked_decompositions, rounded_16, scalar_fits
from .autograd_decomps import (
    hardshrink_in_table,
    in_table,
    multi_margin_loss,
    multilabel_margin_loss_forward,
)
from .conv_grads import conv_grad_decompositions
from .eager_strides import in_eager_layout, is_iterator_op
from .layout_decomps import layout_decompositions
from .linspace_decomps import integer_linspaces
from .loss_decomps import loss_decompositions
from .norm_decomps import batch_norm_decompositions
from .optimizer_decomps import optimizer_decompositions
from .pool_decomps import pool_decompositions
from .pool_dtypes import kept_upsampling
from .special_decomps import special_decompositions

aten = torch.ops.aten


@functools.cache
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """Core-ATen decompositions, plus a few composite ops split so their parts fuse."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions([
        aten._native_batch_norm_legit_no_training,
        aten._native_batch_norm_legit_functional,
        aten._native_batch_norm_legit,
        aten.native_batch_norm,
        aten.native_group_norm,
        aten.hardswish,
        aten.hardsigmoid,
    ]))
    # Softmax and log-softmax are split into their reductions and pointwise parts: then the
    # training partitioner sees that only the row statistics need saving (it cannot look inside
    # a whole _log_softmax, and would save the full output for the backward).
    # (of floats: ATen's kernels reject integer inputs, whose decomposition would compute them)
    table.update({op: _floats_only(fn) for op, fn in get_decompositions([aten._softmax, aten._log_softmax]).items()})
    # (over a dim out of range the op stays: ATen raises eager's IndexError, where the
    # decomposition's amax raised while tracing and the whole graph ran eagerly, with a warning)
    for op in (aten._softmax.default, aten._log_softmax.default):
        table[op] = _eager_when(table[op], _dim_out_of_range)
    # ember lowers these itself, keeping the whole op visible to fusion and to kernel names
    # (index_add and index_copy also keep eager's errors: their decompositions wrap negative
    # indices, which eager refuses; roll's index_select ran through ATen).
    for op in (aten.native_layer_norm.default, aten.gelu.default, aten.var_mean.correction,
               aten.var.correction, aten.std.correction, aten.std_mean.correction, aten.index_add.default,
               aten.index_copy.default, aten.roll.default):
        table.pop(op, None)
    # Their decompositions drop a check eager makes: they keep the op (ATen raises as eager
    # does) where it applies.
    for op, fn in get_decompositions([aten.masked_fill.Scalar, aten.index_fill.int_Scalar]).items():
        table[op] = _eager_when(fn, _fill_overflows)
    # index_fill's decomposition is an index_copy, which refuses the negative indices eager's
    # index_fill takes: they are wrapped first
    for op in (aten.index_fill.int_Scalar, aten.index_fill.int_Tensor):
        table[op] = _wrapping_negative_indices(table[op])
    # (its value of any dtype: the decomposition's index_copy refused one not x's)
    table[aten.index_fill.int_Tensor] = _fill_value_in_dtype(table[aten.index_fill.int_Tensor])
    table[aten.logsumexp.default] = _eager_when(table[aten.logsumexp.default], _over_no_dims)
    # eager's kernel converts its replacements unchecked (float32 posinf=1e39 is inf); the
    # decomposition's scalar_tensor raised "value cannot be converted ... without overflow"
    table[aten.nan_to_num.default] = _replacements_in_dtype(table[aten.nan_to_num.default])
    # (no 16-bit kernel in eager, CPU or GPU: its NotImplementedError, where the decomposition computed)
    table[aten.special_log_ndtr.default] = _eager_when(table[aten.special_log_ndtr.default], _16_bit)
    # A 0-d tensor value is checked against the filled dtype when the op runs (float32's
    # finfo.min into float16 attention scores raises in eager; the decomposition gave -inf)
    table[aten.masked_fill.Tensor] = _eager_when(table[aten.masked_fill.Tensor], _value_may_overflow)
    # ATen has no integer kernels for these (no bool one for addcmul); the decompositions compute
    for op in (aten.lerp.Scalar, aten.lerp.Tensor, aten.silu.default, aten.logaddexp.default,
               aten.hardsigmoid.default, aten.hardswish.default, aten.softplus.default, aten.frac.default,
               aten.glu.default, aten.mish.default, aten.celu.default, aten.log_sigmoid_forward.default,
               aten._prelu_kernel.default, aten.softshrink.default,
               aten.smooth_l1_loss.default, aten.huber_loss.default, aten.mse_loss.default):
        if op in table:
            table[op] = _floats_only(table[op])
    # nor for these dtypes (im2col's integers: F.unfold; reflection padding's and mvlgamma's bools)
    table[aten.im2col.default] = _eager_when(table[aten.im2col.default], _integer)
    for op in (aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
               aten.mvlgamma.default):
        table[op] = _eager_when(table[op], _bool)
    # their decompositions drop ATen's check that both operands have one dtype (and mv, dot, vdot,
    # trace and cross have no bool kernels): a float32 @ float64 vector computed where eager raises
    table[aten.heaviside.default] = _eager_when(table[aten.heaviside.default], lambda x, v: x.dtype != v.dtype)
    for op in (aten.mv.default, aten.dot.default, aten.vdot.default, aten.linalg_cross.default, aten.trace.default):
        if op in table:
            table[op] = _eager_when(table[op], _mixed_or_bool)
    # (and their references refuse a float value for integers, which eager's kernels truncate
    # (the whole graph ran eagerly), and compute integer addcdiv, which eager refuses)
    if aten.addcmul.default in table:
        table[aten.addcmul.default] = _eager_when(table[aten.addcmul.default], _addc_kept)
    if aten.addcdiv.default in table:
        table[aten.addcdiv.default] = _eager_when(table[aten.addcdiv.default], _addc_kept_or_integer)
    # Its decomposition makes a 1-pixel grid with torch.tensor(0), an in-place detach_ that
    # AOTAutograd refuses (the compile failed); ATen makes those grids.
    table[aten.affine_grid_generator.default] = _eager_when(table[aten.affine_grid_generator.default],
                                                            _one_pixel_side)
    # Its decomposition raises NotImplementedError for a negative base, which eager computes
    # (the whole graph ran eagerly): ATen makes those
    for op in (aten.logspace.default, aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar,
               aten.logspace.Scalar_Tensor):
        if op in table:
            table[op] = _eager_when(table[op], _negative_base)
    # ATen special-cases empty inputs (pixel_unshuffle returns them as they are, shape included).
    for op in (aten.pixel_shuffle.default, aten.pixel_unshuffle.default):
        table[op] = _eager_when(table[op], _empty)
    # Its decomposition divides by the group's size: over 0 channels or pixels a
    # ZeroDivisionError ran the whole training graph eagerly (keeping the op does not help:
    # fake tensors run the same decomposition for its shapes)
    table[aten.native_group_norm_backward.default] = _empty_groups_apart(
        table[aten.native_group_norm_backward.default])
    # Its decomposition returns the attention weights where the op returns the log-sum-exp. In a
    # training graph the op's backward (never decomposed) then reads the weights as the
    # log-sum-exp, and every gradient is wrong, silently. It runs through ATen, as in Inductor.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    # Its decomposition (rand < p) drops ATen's checks that p is a float tensor in [0, 1]: a p
    # of 1.5 or NaN drew samples where eager raises. It runs through ATen (dropout does not use it).
    table.pop(aten.bernoulli.default, None)
    # Their decompositions scatter into the flattened output at index + plane * plane size, with
    # no check of the index against the plane: one past its plane (or negative) was written into
    # the neighbouring plane, silently, where eager raises "Found an invalid max index". ATen runs them.
    for op in (aten.max_unpool2d.default, aten.max_unpool3d.default):
        table.pop(op, None)
    # binary_cross_entropy's decomposition skips the check that inputs are in [0, 1]: ATen runs
    # it. Backward decompositions that differ from eager's kernels at the edges (NaN, overflow,
    # float16's epsilon) are replaced by eager's formulas (loss_decomps.py).
    table.pop(aten.binary_cross_entropy.default, None)
    table.update(loss_decompositions())
    # logit's bounds and 16-bit steps rounded as eager's kernels hold them, threshold's and celu's
    # arguments as eager's take them (special_decomps.py)
    table.update(special_decompositions())
    # oneDNN's bfloat16 weight gradients leave taps that meet no input unwritten (conv_grads.py)
    table.update(conv_grad_decompositions())
    table[aten.smooth_l1_loss.default] = _eager_when(table[aten.smooth_l1_loss.default], _negative_beta)
    # eager computes in the target's dtype, in place ((1 - target).mul_(input)), so an integer or
    # bool target raises; the decomposition cast the loss to int64 and returned it
    table[aten.binary_cross_entropy_with_logits.default] = _eager_when(
        table[aten.binary_cross_entropy_with_logits.default], _integer_target)
    # eager takes int64 and uint8 targets (an int32 one raises in eager, not in the decomposition)
    # and class weights of the input's dtype
    for op, at in ((aten.nll_loss_forward.default, 1), (aten.nll_loss2d_forward.default, 1),
                   (aten.nll_loss_backward.default, 2), (aten.nll_loss2d_backward.default, 2)):
        table[op] = _eager_when(table[op], functools.partial(_nll_refused, at=at))
    # eager's huber_loss_backward kernel refuses an input and a target of different dtypes
    # ("Found dtype Float but expected Double"), whose forward it computes
    table[aten.huber_loss_backward.default] = _eager_when(table[aten.huber_loss_backward.default], _mixed_operands)
    # and so does its CUDA mse_loss_backward ("Found dtype Float but expected BFloat16"), which
    # torch 2.13's CPU one computes, as the decomposition does (kept, a CPU op over no elements
    # failed the trace: the fake tensor's shape came from torch's decomposition, which divides by 0)
    table[aten.mse_loss_backward.default] = _eager_when(table[aten.mse_loss_backward.default],
                                                        _mixed_operands_refused)
    # batch norm's mean in training as eager's: inf where a channel holds inf (norm_decomps.py)
    table.update(batch_norm_decompositions())
    for op in (aten._native_batch_norm_legit_no_training.default, aten._native_batch_norm_legit_functional.default,
               aten._native_batch_norm_legit.default, aten._native_batch_norm_legit.no_stats,
               aten.native_batch_norm.default, aten.native_group_norm.default):
        # (eager's CUDA group norm refuses the mix its CPU kernel takes)
        table[op] = _norm_parameter_dtypes(table[op], mixed_on_gpus=op is not aten.native_group_norm.default)
    # Over an empty input (no samples, channels or pixels) the decomposition's var_mean over
    # groups of no elements warned "degrees of freedom is <= 0", which eager's group norm does
    # not: ATen runs it (nothing to compute; its mean and rstd are eager's, 0 and NaN)
    table[aten.native_group_norm.default] = _eager_when(table[aten.native_group_norm.default], _empty)
    # torch's decompositions give a term at the margin a gradient and let a NaN in (autograd_decomps.py)
    table[aten.multi_margin_loss.default] = in_table(multi_margin_loss)
    table[aten.multilabel_margin_loss_forward.default] = in_table(multilabel_margin_loss_forward)
    # (integers, bools and a lambd out of range keep the op: eager's kernel refuses them)
    table[aten.hardshrink.default] = hardshrink_in_table
    # list ops split per tensor, Dynamo's fma, add's symbolic alpha, GradScaler's ops (optimizer_decomps.py)
    table.update(optimizer_decompositions())
    # channel_shuffle's result in its input's memory format, as eager's (layout_decomps.py)
    table.update(layout_decompositions())
    # max pooling as one pointwise kernel that fuses with its input, eager's indices kept (pool_decomps.py)
    table.update(pool_decompositions())
    # torch's decomposition indexes with Python's x[index], which reads a 0-d index as an int
    # through .item(): a data-dependent size that fake tensors refuse (the whole graph ran eagerly)
    table[aten.take.default] = _take
    # torch has none: weight norm's backward (weight_norm's, whose forward is decomposed) ran
    # through ATen in every training step of a weight-normed layer
    table[aten._weight_norm_interface_backward.default] = _weight_norm_interface_backward
    # An op over a tensor of a dtype ember generates no code for (complex, float8, uint32) keeps
    # the op: its parts would run through ATen one by one anyway, and the decompositions compute
    # where eager's kernels refuse the dtype (mse_loss, xlogy, nansum of complex) or fail to trace
    # it (nan_to_num's isneginf ran the whole graph eagerly). The optimizers' decompositions
    # decide for themselves: a list op is split all the same, each part an op over one tensor.
    # Its decomposition branches on the index's sign: a SymInt index added a guard (a recompile
    # once it turned negative), and an unbacked one (y[n] with n from .item(), in training:
    # select's backward) failed the trace, and the whole graph ran eagerly
    table[aten.select_scatter.default] = _select_scatter
    # Python numbers eager converts with its overflow check (float16's linspace to 7e4, addr's
    # alpha): one out of range keeps the op, and ATen raises eager's error; a symbolic one is
    # checked on each call (aten_scalars.py)
    table.update(range_checked_decompositions(table))
    # an integer linspace keeps the op (no kernel rounds as eager's), taking a symbolic float as a
    # tensor: one graph for every value (linspace_decomps.py)
    table.update(integer_linspaces(table))
    # upsampling of integers keeps ATen's op, which refuses them as eager (pool_dtypes.py)
    table.update(kept_upsampling(table))
    per_tensor = optimizer_decompositions()
    for op, fn in table.items():
        if is_iterator_op(op):  # (eager's layout, where the decomposition's ops give another)
            fn = in_eager_layout(op, fn)
        if op not in per_tensor:
            table[op] = _eager_when(fn, _any_opaque_dtype)
    return table


def _any_opaque_dtype(*args: Any, **kwargs: Any) -> bool:
    """Is any tensor among the arguments (or in a list of them) of a dtype ember has no code for?"""
    def opaque(a: Any) -> bool:
        if isinstance(a, (list, tuple)):
            return any(opaque(x) for x in a)
        return isinstance(a, torch.Tensor) and not dt.is_supported_torch(a.dtype)
    return opaque(args) or opaque(tuple(kwargs.values()))


def _weight_norm_interface_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                                    saved_norms: torch.Tensor, dim: int) -> Any:
    """(grad_v, grad_g) of ``w = v * g / norms``, the norms over every dim but ``dim``, as ATen's
    kernel computes them (16-bit tensors in float32). Inputs its kernel refuses (not contiguous,
    ``dim`` neither the first nor the last) keep the op: ATen raises as eager does."""
    if (not all(t.is_contiguous() for t in (grad_w, saved_v, saved_g, saved_norms))
            or dim not in (0, saved_v.dim() - 1)):
        return NotImplemented
    keep = [d for d in range(saved_v.dim()) if d != dim]
    acc = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    v, grad, g, norms = (t.to(acc) for t in (saved_v, grad_w, saved_g, saved_norms))
    # (a sum over no dims, a 1-d v, would be over every dim)
    along = (grad * v).sum(keep, keepdim=True) if keep else grad * v
    grad_v = (g / norms) * (grad - v * (along / (norms * norms)))
    return grad_v.to(saved_v.dtype), (along / norms).to(saved_g.dtype)


def _select_scatter(x: torch.Tensor, src: torch.Tensor, dim: int, index: Any) -> Any:
    """``x`` with ``src`` written over ``x.select(dim, index)``, as torch's decomposition writes
    it, but with a symbolic index compared as it is and wrapped from the end (one of the two
    matches an index in range) rather than branched on its sign. An index out of range raises
    eager's IndexError (torch's decomposition returned ``x`` unchanged)."""
    if x.dim() == 0:
        return NotImplemented  # (ATen raises eager's error)
    dim = dim % x.dim()
    n = x.shape[dim]
    # (a symbolic index in range is a guard; one the data decides, a check when the graph runs)
    if not (guard_or_true(index < n) and guard_or_true(index >= -n)):
        return NotImplemented  # (ATen raises eager's error)
    # eager wants src exactly the selected slice's shape: one that would broadcast (a [1] or a
    # 0-d src) was written over the slice instead of raising
    slice_shape = x.shape[:dim] + x.shape[dim + 1:]
    if src.dim() != len(slice_shape) or not all(guard_or_true(a == b) for a, b in zip(src.shape, slice_shape)):
        return NotImplemented  # (ATen raises eager's error)
    torch._check_index(index < n, lambda: f"select_scatter(): index {index} out of range for size {n}")
    torch._check_index(index >= -n, lambda: f"select_scatter(): index {index} out of range for size {n}")
    along = [1] * x.dim()
    along[dim] = -1
    at = torch.arange(n, device=x.device).view(along)
    if isinstance(index, int):
        mask = at == (index + n if index < 0 else index)
    else:
        mask = (at == index) | (at == index + n)
    # (in x's dtype, as eager copies src into it; where() promoted to src's)
    return torch.where(mask, src.to(x.dtype).unsqueeze(dim).expand(x.shape), x)


def _floats_only(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """``decomposition`` for floating-point inputs; other inputs keep the op (NotImplemented
    tells the tracer so), which ATen then runs and rejects as eager does."""
    @functools.wraps(decomposition)
    def decompose(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not x.dtype.is_floating_point:
            return NotImplemented
        return decomposition(x, *args, **kwargs)
    return decompose


def _integer(x: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    return not (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool)


def _bool(x: torch.Tensor, *args: Any, **kwargs: Any) -> bool:
    return x.dtype == torch.bool


def _negative_base(start: Any, end: Any, steps: Any, base: Any = 10.0, **_: Any) -> bool:
    return isinstance(base, (int, float)) and base < 0


def _eager_when(decomposition: Callable[..., Any], keep_op: Callable[..., bool]) -> Callable[..., Any]:
    """``decomposition``, except where ``keep_op(*args)``: NotImplemented then tells the tracer
    to keep the op, which ATen runs (and rejects, or computes, as eager does)."""
    @functools.wraps(decomposition)
    def decompose(*args: Any, **kwargs: Any) -> Any:
        if keep_op(*args, **kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decompose


def _empty_groups_apart(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """native_group_norm_backward, with groups of no elements (0 channels or 0 pixels) computed
    as eager's kernel computes them: the input's gradient is empty, the bias's 0 and the
    weight's the sum over the batch of 0 * mean * rstd (NaN where the group's mean is 0/0)."""
    @functools.wraps(decomposition)
    def decompose(grad: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                  weight: torch.Tensor | None, n: Any, c: Any, hxw: Any, group: int,
                  mask: Sequence[bool]) -> Any:
        if not (isinstance(c, int) and c // group == 0 or isinstance(hxw, int) and hxw == 0):
            return decomposition(grad, x, mean, rstd, weight, n, c, hxw, group, mask)
        dtype = weight.dtype if weight is not None else x.dtype
        per_group = (mean * rstd * 0).reshape(n, group, 1).expand(n, group, c // group)
        return (x.new_zeros(x.shape) if mask[0] else None,
                per_group.reshape(n, c).sum(0).to(dtype) if mask[1] else None,
                x.new_zeros((c,), dtype=dtype) if mask[2] else None)
    return decompose


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """take as an index of ``x`` flattened, by an index tensor of any rank (0-d too)."""
    return aten.index.Tensor(x.reshape(-1), [index])


def _wrapping_negative_indices(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """``decomposition(x, dim, index, value)`` with each negative index plus ``x``'s size along
    ``dim`` (one below minus the size stays negative: index_copy's IndexError, as eager's)."""
    @functools.wraps(decomposition)
    def decompose(x: torch.Tensor, dim: int, index: torch.Tensor, value: Any) -> Any:
        if not index.dtype.is_floating_point and index.dtype != torch.bool:
            size = x.shape[dim] if x.dim() > 0 else 1
            index = torch.where(index < 0, index + size, index)
        return decomposition(x, dim, index, value)
    return decompose


def _fill_value_in_dtype(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """index_fill's ``decomposition(x, dim, index, value)`` with its 0-d tensor value converted to
    x's dtype, as eager fills with its item(). ATen keeps the op where eager raises: an index not
    int64 (its IndexError), a value whose dtype can hold values out of x's range (overflow)."""
    @functools.wraps(decomposition)
    def decompose(x: torch.Tensor, dim: int, index: torch.Tensor, value: torch.Tensor) -> Any:
        if index.dtype != torch.int64 or value.dtype != x.dtype and _value_may_overflow(x, index, value):
            return NotImplemented
        return decomposition(x, dim, index, value.to(x.dtype))
    return decompose


def _mixed_or_bool(*args: Any, **_: Any) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return any(t.dtype == torch.bool for t in tensors) or len({t.dtype for t in tensors}) > 1


def _fill_overflows(x: torch.Tensor, *args: Any, **_: Any) -> bool:
    """masked_fill / index_fill with a Python scalar out of ``x``'s range (eager raises "value
    cannot be converted ... without overflow", the decomposition's scalar_tensor gives inf), or
    index_fill with an index that is not int64 (eager's IndexError; the decomposition's
    index_copy raises a RuntimeError)."""
    value = args[-1]
    if len(args) == 3 and isinstance(args[1], torch.Tensor) and args[1].dtype != torch.int64:
        return True
    return isinstance(value, (int, float)) and not scalar_fits(value, x.dtype)


def _value_may_overflow(x: torch.Tensor, mask: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any) -> bool:
    """Can ``value``'s dtype hold values out of ``x``'s range (ATen's overflow error)?"""
    into, of = x.dtype, value.dtype
    if into in (torch.bool, of) or into.is_complex or of == torch.bool:
        return False
    if of.is_complex:
        return True
    high = (torch.finfo if of.is_floating_point else torch.iinfo)(of)
    if into.is_floating_point:
        return high.max > torch.finfo(into).max
    limits = torch.iinfo(into)
    return of.is_floating_point or high.max > limits.max or high.min < limits.min


def _mixed_operands(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any, **__: Any) -> bool:
    return isinstance(target, torch.Tensor) and x.dtype != target.dtype


def _mixed_operands_refused(grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, *_: Any,
                            **__: Any) -> bool:
    """An input and a target of two dtypes where eager's mse_loss_backward refuses them: on a
    GPU, and on the CPU before torch 2.13 (asked of the CPU kernel once)."""
    if not _mixed_operands(grad, x, target):
        return False
    return x.device.type != "cpu" or _cpu_mse_backward_refuses(x.dtype, target.dtype)


@functools.cache
def _cpu_mse_backward_refuses(input_dtype: torch.dtype, target_dtype: torch.dtype) -> bool:
    # (asked while tracing: with the tracer's fake and proxy modes off, the kernel itself answers)
    with torch.utils._python_dispatch._disable_current_modes():
        try:
            torch.ops.aten.mse_loss_backward(torch.ones(1, dtype=input_dtype), torch.ones(1, dtype=input_dtype),
                                             torch.ones(1, dtype=target_dtype), 1)
        except RuntimeError:
            return True
    return False


def _integer_target(x: torch.Tensor, target: torch.Tensor, *_: Any, **__: Any) -> bool:
    return not (target.dtype.is_floating_point or target.dtype.is_complex)


def _negative_beta(x: torch.Tensor, target: torch.Tensor, reduction: int = 1, beta: float = 1.0) -> bool:
    # (eager checks beta >= 0, which a NaN beta fails too: the decomposition computed NaN)
    return isinstance(beta, (int, float)) and not beta >= 0


def _nll_refused(*args: Any, at: int, **_: Any) -> bool:
    """nll_loss (forward: self, target, weight; backward: grad, self, target, weight) with a
    target not int64, or weights of another dtype than self: eager's kernel decides."""
    weight = args[at + 1] if len(args) > at + 1 else None
    return args[at].dtype != torch.int64 or isinstance(weight, torch.Tensor) and weight.dtype != args[at - 1].dtype


def _norm_parameter_dtypes(decomposition: Callable[..., Any], mixed_on_gpus: bool) -> Callable[..., Any]:
    """batch / group norm whose parameters (weight, bias, running statistics) have another dtype
    than the input: eager takes float32 ones with a 16-bit input (autocast's mix), and then keeps
    the statistics it saves for the backward in float32, where the decomposition rounds them to
    the input's dtype on the CPU (a float32 weight's gradient then had bfloat16's error): the
    decomposition runs on the input in float32 and only the output is rounded. Other mixes keep
    the op (eager's kernel refuses them), and so does an input that is not real floating-point:
    eager has no complex kernel, where the decomposition computed a complex result. So does an
    input with no channel dim (1-d): eager's kernel raises IndexError reading it, where the
    decomposition normalized the vector."""
    @functools.wraps(decomposition)
    def decompose(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not x.dtype.is_floating_point or x.dim() < 2:
            return NotImplemented
        params = [a for a in args[:4] if isinstance(a, torch.Tensor)]
        if all(p.dtype == x.dtype for p in params):
            return decomposition(x, *args, **kwargs)
        if (x.dtype in (torch.float16, torch.bfloat16) and all(p.dtype == torch.float32 for p in params)
                and (mixed_on_gpus or x.device.type == "cpu")):
            out = decomposition(x.float(), *args, **kwargs)
            return (out[0].to(x.dtype), *out[1:])
        return NotImplemented
    return decompose


def _replacements_in_dtype(decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """nan_to_num with its replacement values converted to a float32 input's dtype as eager's
    kernel converts them (a C cast: beyond the range is inf), and a 16-bit input's too: on the GPU
    the decomposition's scalar_tensor checks the range and raised where eager's kernel gives inf
    (the CPU's scalar_tensor rounds unchecked already). A Python float always fits float64."""
    @functools.wraps(decomposition)
    def decompose(x: torch.Tensor, nan: Any = 0.0, posinf: Any = None, neginf: Any = None) -> Any:
        if x.dtype == torch.float32:
            nan, posinf, neginf = (ctypes.c_float(v).value if isinstance(v, (int, float)) else v
                                   for v in (nan, posinf, neginf))
        elif x.dtype in (torch.float16, torch.bfloat16):
            nan, posinf, neginf = (rounded_16(float(v), x.dtype) if isinstance(v, (int, float)) else v
                                   for v in (nan, posinf, neginf))
        return decomposition(x, nan, posinf, neginf)
    return decompose


def _16_bit(x: torch.Tensor, *_: Any, **__: Any) -> bool:
    return x.dtype in (torch.float16, torch.bfloat16)


def _one_pixel_side(theta: torch.Tensor, size: Sequence[Any], *_: Any, **__: Any) -> bool:
    return any(isinstance(s, int) and s == 1 for s in size[2:])


def _empty(x: torch.Tensor, *_: Any, **__: Any) -> bool:
    return any(isinstance(s, int) and s == 0 for s in x.shape)


def _addc_kept(x: torch.Tensor, t1: Any, t2: Any, value: Any = 1, **_: Any) -> bool:
    """addcmul/addcdiv ATen runs: of bools (no kernel), or of integers with a value that is not
    an integer (eager's kernel truncates it, overflow checked)."""
    if x.dtype == torch.bool:
        return True
    _, dtype = elementwise_dtypes(x, t1, t2, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    return not (dtype.is_floating_point or dtype.is_complex) and not isinstance(value, (bool, int, torch.SymInt))


def _addc_kept_or_integer(x: torch.Tensor, t1: Any, t2: Any, value: Any = 1, **_: Any) -> bool:
    integer = all(isinstance(t, torch.Tensor) and not (t.dtype.is_floating_point or t.dtype.is_complex)
                  for t in (t1, t2))
    return integer or _addc_kept(x, t1, t2, value)


def _dim_out_of_range(x: torch.Tensor, dim: Any, *_: Any, **__: Any) -> bool:
    """A dim outside [-rank, rank) ([-1, 0] for a 0-d tensor), as eager wraps dims."""
    rank = max(x.dim(), 1)
    return isinstance(dim, int) and not -rank <= dim < rank


def _over_no_dims(x: torch.Tensor, dim: Any = (), *_: Any, **__: Any) -> bool:
    """logsumexp over ``dim=()`` of a tensor with dims: eager's kernel reduces its max over
    every dim and then fails (or not, when empty) to broadcast it back; the decomposition
    returns a (1, ..., 1) tensor where eager raises."""
    return isinstance(dim, (list, tuple)) and len(dim) == 0 and x.dim() > 0
