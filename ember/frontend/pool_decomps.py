"""Max and average pooling (1-d, 2-d, 3-d) as one pointwise kernel over the output.

ATen's ``max_pool2d_with_indices``, ``max_pool3d_with_indices``, ``avg_pool2d`` and
``avg_pool3d`` ran as calls of their own: ``F.max_pool2d(relu(x))`` wrote relu's result to memory
for ATen to read back. Here each of a window's positions is a strided view of the input, and the
window is reduced in eager's order in one kernel that reads the input (and whatever pointwise
work produced it) in place: neighbouring lanes read neighbouring windows.

Max pooling: torch has a decomposition of these ops (a gather and an argmax); it differs from
eager's kernels where this one does not:

* a window whose values are all -inf: eager returns the index of the window's first position
  inside the input, where an argmax over the window padded with -inf may return a padding
  position (a negative index, or one in another row);
* NaN: eager's kernels (CPU and CUDA) replace the running maximum by every NaN they meet, so the
  index is the window's *last* NaN, where argmax gives the first.

Average pooling: the window's sum, from +0.0 in the window's order (in float for 16-bit inputs),
divided once by eager's divisor: ``divisor_override``, else the window's size cut at the
padding's end (ceil_mode's last windows reach past it), and with ``count_include_pad=False`` cut
at the input's edges too.

Where it is decomposed (``bench/pooling.py`` measured each choice against ATen's kernels):
floating inputs, windows of up to ``UNROLLED_WINDOW`` positions; on the CPU unpadded windows,
and padded ones in inference on contiguous (NCHW) inputs, whose output rows the C++ backend
splits where every window lies inside the input (codegen/cpp_split.find_window: the interior
unguarded and vectorized), and on channels_last 16-bit ones. Elsewhere padding and ceil_mode make each position's load
conditional, which keeps the loop from vectorizing: slower than ATen's kernel. A channels_last
input is pooled as (N, H, W, C), the channels innermost; the results are laid out as eager's
(its meta function's). eager's checks (kernel, stride, padding and dilation against the input's
size) are its meta function's, run first, with eager's messages.

Backwards: each input position sums the gradients of the windows that can hold it (at most
ceil(window / stride) a dim, unrolled; from +0.0, in increasing window order, in float for 16-bit
gradients: eager's sums), a pointwise kernel over the input, gathering, with no scatter or atomics,
that fuses with what comes before it. Max pooling: a window's gradient goes where its index is the
position's own; average pooling: its share over eager's divisor. Where the windows tile the input
(stride = window, no padding or dilation: a VGG block's or a DenseNet transition's 2x2) the one
window is found by division. Overlapping windows are gathered on GPUs only (on the CPU the gather
took 1.5-6x ATen's kernel's time: bench/pooling.py), as padded windows: each candidate window a
strided view (``_gathered``); max pooling's is off for now (``GATHERED_MAX_BACKWARD``). A training
step saves max pooling's int8 window positions, a byte an output, and its backward compares each
candidate's position with the input position's place in that window (``_in_window``): saved int64
indices are 8 bytes, and saving the padded input, as the partitioner did before, had the backward
pool each window again.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten

# Windows of up to this many positions are unrolled, one strided view each (Inductor's limit too);
# larger ones keep ATen's kernel.
UNROLLED_WINDOW = 25
# Padded windows (and ceil_mode's), and the backwards of overlapping windows, on the CPU keep ATen's
# kernel (slower decomposed: see above); tests turn this on to check the values on CPU tensors.
PADDED_ON_CPU = False
# Overlapping max pooling's backward keeps ATen's kernel (``_max_backward`` says why); tests and
# bench/pooling.py turn the gather on.
GATHERED_MAX_BACKWARD = False


def _expand(value: Sequence[Any] | int, n_dim: int, default: Sequence[Any] | None = None) -> list[Any]:
    value = list(value) if isinstance(value, (list, tuple)) else [value]
    if not value:
        return list(default or ())
    return value * n_dim if len(value) == 1 else value


def _decomposed(x: torch.Tensor, ks: list[int], st: list[int], pa: list[int], ceil_mode: bool) -> bool:
    on_cpu = x.device.type == "cpu"
    # (a window or stride of 0 goes to ATen, for eager's own error: the meta functions of some
    # torch versions check the stride first, with another message)
    # Padded windows on the CPU, in inference (no gradient: no indices to compute), where the
    # input is contiguous (NCHW) or channels_last in a 16-bit float: the C++ backend splits each
    # output row where its windows lie inside the input (codegen/cpp_split.find_window), or runs
    # a channels_last pixel's channels with all of its window's guards constant, and the loop
    # vectorizes. Training steps (the indices, then ATen's backward) stay slower than ATen's
    # kernels, and so do float32 channels_last rows at a ResNet stem's size (2.6 ms against 2.5)
    nchw = x.is_contiguous() and suggest_memory_format(x) == torch.contiguous_format
    half_nhwc = (x.dim() == 4 and x.dtype.itemsize == 2 and suggest_memory_format(x) == torch.channels_last
                 and x.is_contiguous(memory_format=torch.channels_last))
    padded_cpu = not ceil_mode and not torch.is_grad_enabled() and (nchw or half_nhwc)
    return (min(ks) > 0 and min(st) > 0
            and x.layout == torch.strided and not x.is_quantized and x.dtype.is_floating_point
            and x.dtype.itemsize >= 2  # (float8 has no max_pool kernel)
            and x.numel() != 0 and math.prod(ks) <= UNROLLED_WINDOW
            and (x.device.type == "cuda" or on_cpu and (PADDED_ON_CPU or padded_cpu or not ceil_mode and not any(pa))))


def _meta(op: Any) -> Callable[..., Any] | None:
    try:
        from torch._meta_registrations import meta_max_pool2d_with_indices, meta_max_pool3d_with_indices
    except ImportError:  # pragma: no cover - private torch API: then the op stays
        return None
    return meta_max_pool2d_with_indices if op is aten.max_pool2d_with_indices else meta_max_pool3d_with_indices


def _avg_meta(op: Any) -> Callable[..., Any] | None:
    try:
        from torch._meta_registrations import meta_avg_pool2d, meta_avg_pool3d
    except ImportError:  # pragma: no cover - private torch API: then the op stays
        return None
    return meta_avg_pool2d if op is aten.avg_pool2d else meta_avg_pool3d


def _max_pool_with_indices(op: Any, n_dim: int) -> Callable[..., Any]:
    meta = _meta(op)

    def decompose(x: torch.Tensor, kernel_size: Sequence[Any], stride: Sequence[Any] = (),
                  padding: Sequence[Any] = (0,), dilation: Sequence[Any] = (1,),
                  ceil_mode: bool = False) -> Any:
        if meta is None:
            return NotImplemented
        ks = _expand(kernel_size, n_dim)
        st = _expand(stride, n_dim, default=ks)
        pa = _expand(padding, n_dim)
        di = _expand(dilation, n_dim)
        if not (len(ks) == len(st) == len(pa) == len(di) == n_dim and _decomposed(x, ks, st, pa, ceil_mode)):
            return NotImplemented  # (ATen: its kernel, or eager's error for malformed arguments)
        if n_dim == 3 and x.device.type == "cpu" and x.dim() == 4 and suggest_memory_format(x) == torch.channels_last:
            # eager's CPU kernel refuses an unbatched input laid out as a channels_last 4-d tensor
            # ("Unsupported memory format"), where the decomposition computed a result: ATen's error
            return NotImplemented
        values_like, _ = meta(x, kernel_size, stride, padding, dilation, ceil_mode)  # (eager's checks)
        out_sizes = list(values_like.shape[-n_dim:])
        xp, first, back = _padded(x, n_dim, pa, st, ceil_mode, -math.inf)  # (padding never beats a value)
        values, at = _unrolled_max(xp, first, out_sizes, ks, st, di)
        index = back(_input_index(at, first, out_sizes, list(x.shape[-n_dim:]), ks, st, pa, di), values_like)
        _remember_positions(index, x, (ks, st, pa, di, ceil_mode), at.movedim(-1, 1) if first == 1 else at,
                            batched=x.dim() == n_dim + 2)
        return back(values, values_like), index
    return decompose


# The window positions behind the indices each traced max pooling returned, by the indices
# tensor's id: a training step's backward decomposition, traced with its forward, finds the
# positions of its own indices here and compares them with each input position's place in the
# candidate window (a byte and a few int32 operations), rather than rebuilding every candidate's
# index. Entries go with their indices tensor.
_POSITIONS: dict[int, tuple[weakref.ref, weakref.ref, tuple[Any, ...], torch.Tensor]] = {}


def _remember_positions(index: torch.Tensor, x: torch.Tensor, geometry: tuple[Any, ...], at: torch.Tensor,
                        batched: bool) -> None:
    key = id(index)
    try:
        refs = (weakref.ref(index, lambda _: _POSITIONS.pop(key, None)), weakref.ref(x))
    except TypeError:  # (a tensor that takes no weak references: the backward rebuilds the indices)
        return
    _POSITIONS[key] = (*refs, geometry, at if batched else at.squeeze(0))


def _positions_of(index: torch.Tensor, x: torch.Tensor, geometry: tuple[Any, ...]) -> torch.Tensor | None:
    """The int8 window positions behind ``index``, if a max pooling of ``x`` with this geometry
    traced in this program returned it (else None)."""
    entry = _POSITIONS.get(id(index))
    if entry is None or entry[0]() is not index or entry[1]() is not x or entry[2] != geometry \
            or entry[3].shape != index.shape:
        return None
    return entry[3]


def _padded(x: torch.Tensor, n_dim: int, pa: list[int], st: list[int], ceil_mode: bool,
            fill: float) -> tuple[torch.Tensor, int, Callable[[torch.Tensor], torch.Tensor]]:
    """``x`` batched, padded with ``fill``, and laid out as pooled; where its spatial dims start;
    and the function putting a result computed in that layout back into eager's. A channels_last
    input is pooled as (N, *spatial, C), whose memory order is the input's and the result's
    (eager's results are channels_last too)."""
    batched = x.dim() == n_dim + 2
    xb = x if batched else x.unsqueeze(0)
    channels_last = batched and suggest_memory_format(x) != torch.contiguous_format
    if channels_last:
        xb = xb.movedim(1, -1)
    pad = [0, 0] if channels_last else []
    for d in reversed(range(n_dim)):  # (ceil_mode's last window may reach stride - 1 past the padding)
        pad += [pa[d], pa[d] + (st[d] - 1 if ceil_mode else 0)]
    if any(pad):
        xb = F.pad(xb, pad, value=fill)

    def back(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        result = result.movedim(-1, 1) if channels_last else result
        return _laid_out_as(result if batched else result.squeeze(0), like)
    return xb, 1 if channels_last else 2, back


def _laid_out_as(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` laid out as eager's result ``like`` (its meta function's), whatever the input's
    strides: a pointwise result takes its operands' order (x.mT's would be transposed), and
    avg_pool3d's result is contiguous for a channels_last_3d input."""
    for layout in (torch.channels_last, torch.channels_last_3d):
        if like.dim() == (4 if layout == torch.channels_last else 5) and not like.is_contiguous() \
                and like.is_contiguous(memory_format=layout):
            result = result.contiguous(memory_format=layout)
            break
    else:
        result = result.contiguous()
    # .contiguous() keeps a tensor whose only odd strides are those of size-1 dims: avg_pool3d of a
    # channels_last_3d input of one channel came out (8, 1, 4, 2, 1) where eager's is (8, 8, 4, 2, 1).
    # Those strides are the user's too (out.stride()): copied into eager's (a copy in the traced
    # graph is no op in ember's IR: the kernel writes that layout).
    if any(statically_known_true(n == 1) and not statically_known_true(a == b)
           for n, a, b in zip(result.shape, result.stride(), like.stride())):
        result = aten.copy.default(torch.empty_strided(like.shape, like.stride(), dtype=result.dtype,
                                                       device=result.device), result)
    return result


def _avg_pool(op: Any, n_dim: int) -> Callable[..., Any]:
    meta = _avg_meta(op)

    def decompose(x: torch.Tensor, kernel_size: Sequence[Any], stride: Sequence[Any] = (),
                  padding: Sequence[Any] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
                  divisor_override: int | None = None) -> Any:
        if meta is None:
            return NotImplemented
        ks = _expand(kernel_size, n_dim)
        st = _expand(stride, n_dim, default=ks)
        pa = _expand(padding, n_dim)
        if not (len(ks) == len(st) == len(pa) == n_dim and _decomposed(x, ks, st, pa, ceil_mode)):
            return NotImplemented
        if n_dim == 3 and x.device.type == "cpu" and x.dtype.itemsize < 4:
            return NotImplemented  # (eager's CPU kernel has no 16-bit avg_pool3d: its error)
        like = meta(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        out_sizes = list(like.shape[-n_dim:])
        # eager sums in float for 16-bit inputs, in the window's order, then divides once
        acc = torch.float32 if x.dtype.itemsize < 4 else x.dtype
        xp, first, back = _padded(x.to(acc), n_dim, pa, st, ceil_mode, 0.0)
        total = None
        for view in _window_views(xp, first, out_sizes, ks, st, [1] * n_dim):
            total = view + 0.0 if total is None else total + view  # (from +0.0, as eager: -0.0s sum to 0.0)
        divisor = _avg_divisor(x, first, out_sizes, ks, st, pa, ceil_mode, count_include_pad, divisor_override)
        return back((total / divisor).to(x.dtype), like)
    return decompose


def _avg_divisor(x: torch.Tensor, first: int, out_sizes: list[Any], ks: list[int], st: list[int], pa: list[int],
                 ceil_mode: bool, count_include_pad: bool, divisor_override: int | None) -> Any:
    """eager's divisor of each window's sum: ``divisor_override``; else the window's size, cut at
    the padding's end (a ceil_mode window can reach past it), and with count_include_pad=False
    cut at the input's edges too."""
    if divisor_override:
        return divisor_override
    if count_include_pad and not ceil_mode:
        return math.prod(ks)  # (every window lies within the padded input)
    windows = []
    for d in range(len(ks)):
        shape = [1] * (len(ks) + 2)
        shape[first + d] = out_sizes[d]
        windows.append(torch.arange(out_sizes[d], device=x.device).reshape(shape))
    return _divisor_of(windows, list(x.shape[-len(ks):]), ks, st, pa, count_include_pad)


def _divisor_of(windows: list[torch.Tensor], in_sizes: list[Any], ks: list[int], st: list[int], pa: list[int],
                count_include_pad: bool) -> torch.Tensor:
    """eager's divisor of the windows numbered ``windows`` (one index tensor a dim, broadcasting)."""
    divisor = None
    for d, o in enumerate(windows):
        start = o * st[d] - pa[d]
        end = torch.clamp(start + ks[d], max=in_sizes[d] + pa[d])
        if not count_include_pad:
            start, end = torch.clamp(start, min=0), torch.clamp(end, max=in_sizes[d])
        divisor = end - start if divisor is None else divisor * (end - start)
    assert divisor is not None
    return divisor


def _window_views(xp: torch.Tensor, first: int, out_sizes: list[Any], ks: list[int], st: list[int],
                  di: list[int]) -> Iterator[torch.Tensor]:
    """Each window position's view of the padded input, in eager's order (the last dim's
    positions innermost): element i of a view is that position of output i's window."""
    for offsets in itertools.product(*[range(n) for n in ks]):
        view = xp
        for d, o in enumerate(offsets):
            view = view.narrow(first + d, o * di[d], (out_sizes[d] - 1) * st[d] + 1)
            view = view[(slice(None),) * (first + d) + (slice(None, None, st[d]),)]
        yield view


def _unrolled_max(xp: torch.Tensor, first: int, out_sizes: list[Any], ks: list[int], st: list[int],
                  di: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each window position a strided view of the padded input, compared in eager's order: a
    value replaces the maximum where it is greater or NaN. Pointwise over the output, so the
    kernel's neighbouring lanes read neighbouring windows (coalesced on GPUs, vectors on CPUs).
    Returns the maxima and the window position of each (-1: nothing beat -inf)."""
    values = at = None
    for k, view in enumerate(_window_views(xp, first, out_sizes, ks, st, di)):
        if values is None:
            # (int8: a byte an output, what a training step saves for the backward to find the
            # indices again, rather than the int64 indices or the input to pool again)
            values, at = view, (view != -math.inf).to(torch.int8) - 1  # (NaN != -inf)
            continue
        take = (view > values) | view.isnan()
        values = torch.where(take, view, values)
        at = torch.where(take, k, at)
    return values, at


def _input_index(at: torch.Tensor, first: int, out_sizes: list[Any], in_sizes: list[Any], ks: list[int],
                 st: list[int], pa: list[int], di: list[int]) -> torch.Tensor:
    """Window positions ``at`` as eager's indices into each input plane; where ``at`` is -1
    (nothing in the window beat -inf), the window's first position inside the input."""
    # (int32 arithmetic where the plane's positions fit, no division by 1, no remainder where
    # the quotient is below the window's size: a training step's backward does this again for
    # each window that can hold a position, and int64 divisions are slow on GPUs)
    plane = math.prod(in_sizes) if all(isinstance(s, int) for s in in_sizes) else None
    itype = torch.int32 if plane is not None and plane < 2**31 else torch.int64
    at = at.to(itype)
    index = first_inside = None
    for d in range(len(ks)):
        inner = math.prod(ks[d + 1:])
        k_d = at // inner if inner > 1 else at
        k_d = k_d % ks[d] if d > 0 else k_d  # (at < the window's size: its first quotient is < ks[0])
        shape = [1] * (len(ks) + 2)
        shape[first + d] = out_sizes[d]
        start = torch.arange(out_sizes[d], device=at.device, dtype=itype).reshape(shape) * st[d] - pa[d]
        coord = start + (k_d * di[d] if di[d] > 1 else k_d)
        start_inside = start.clamp(min=0) if di[d] == 1 else \
            torch.where(start < 0, start + (-start + di[d] - 1) // di[d] * di[d], start)
        index = coord if index is None else index * in_sizes[d] + coord
        first_inside = start_inside if first_inside is None else first_inside * in_sizes[d] + start_inside
    return torch.where(at >= 0, index, first_inside).long()


def pool_decompositions() -> dict[Any, Callable[..., Any]]:
    """Decomposition-table entries for max and average pooling and their backwards (torch 2.13's
    decomposition of max pooling's backward, a scatter-add at the indices, took 1.8x as long as
    ATen's kernel on the CPU; these gather)."""
    return {aten.max_pool2d_with_indices.default: _max_pool_with_indices(aten.max_pool2d_with_indices, 2),
            aten.max_pool3d_with_indices.default: _max_pool_with_indices(aten.max_pool3d_with_indices, 3),
            aten.avg_pool2d.default: _avg_pool(aten.avg_pool2d, 2),
            aten.avg_pool3d.default: _avg_pool(aten.avg_pool3d, 3),
            aten.max_pool2d_with_indices_backward.default: _max_backward(2, "max_pool2d_with_indices"),
            aten.max_pool3d_with_indices_backward.default: _max_backward(3, "max_pool3d_with_indices"),
            aten.avg_pool2d_backward.default: _avg_backward(2, "avg_pool2d"),
            aten.avg_pool3d_backward.default: _avg_backward(3, "avg_pool3d")}


# ---- backwards ------------------------------------------------------------------------------------

def _tiles(x: torch.Tensor, grad: torch.Tensor, ks: list[int], st: list[int], pa: list[int], di: list[int],
           ceil_mode: bool) -> bool:
    """Do the windows tile the input (stride = window, no padding or dilation), so that each input
    position gets the gradient of at most one window, and its own window is found by division?"""
    n_dim = len(ks)
    if not (len(st) == len(pa) == len(di) == n_dim and st == ks and not any(pa) and all(d == 1 for d in di)
            and grad.dtype.is_floating_point and grad.dtype.itemsize >= 2 and x.numel() != 0
            and grad.device.type in ("cpu", "cuda") and grad.layout == torch.strided):
        return False
    # (ceil_mode's last windows are partial unless the sizes divide)
    return not ceil_mode or all(size % k == 0 for size, k in zip(x.shape[-n_dim:], ks))


def _spread(t: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Each element of ``t``'s last ``len(ks)`` dims repeated over its window: the sizes times ``ks``."""
    for d, k in enumerate(ks):
        dim = t.dim() - len(ks) + d
        t = t.unsqueeze(dim + 1).expand(*t.shape[:dim + 1], k, *t.shape[dim + 1:]).flatten(dim, dim + 1)
    return t


def _cover(t: torch.Tensor, in_sizes: list[Any]) -> torch.Tensor:
    """``t`` zero-padded at the end of its last dims to ``in_sizes``: the input's rows past the last
    whole window get no gradient."""
    pad: list[Any] = []
    for d in reversed(range(len(in_sizes))):
        pad += [0, in_sizes[d] - t.shape[t.dim() - len(in_sizes) + d]]
    return F.pad(t, pad) if any(not isinstance(p, int) or p for p in pad) else t


def _backward_meta(name: str) -> Callable[..., Any] | None:
    """eager's meta function of ``name``'s backward (its checks, and its result's layout)."""
    import torch._meta_registrations as metas
    return getattr(metas, f"meta_{name}_backward", None)


Take = Callable[[torch.Tensor], torch.Tensor]


def _gathered(x: torch.Tensor, grad: torch.Tensor, ks: list[int], st: list[int], pa: list[int], span: list[int],
              term: Callable[[Take, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor],
              meta: Callable[[], torch.Tensor]) -> Any:
    """The general backward in gather form, pointwise over the input: each input position sums
    ``term(take, windows, valid)`` over the windows that can hold it, in increasing window order
    (the last dim's innermost), from +0.0, in float for 16-bit gradients (eager's CUDA kernels; its
    CPU kernels add each window's share in the output's order: the same sum). ``take(t)`` is a
    tensor laid out as the gradient, at the candidate windows (0 past the output's edges);
    ``windows`` the candidates' numbers (one int32 tensor a dim, broadcasting over the input's
    spatial dims; -1 past the edges), ``valid`` where a candidate exists and its window's
    ``span`` reaches the position. ``meta()`` runs eager's checks and gives its result's layout.
    NotImplemented where not decomposed (ATen's kernel).

    A candidate is a strided view: the tensor zero-padded, each element repeated ``stride`` times
    along the dim, narrowed at the candidate's offset. So the kernel finds each candidate's place
    with its own index arithmetic (non-negative quotients, in int32 where the sizes fit), where
    indexing by computed window numbers took int64 divisions, wrapping of negative indices and
    clamping, per candidate and element."""
    n_dim = len(ks)
    if not (len(st) == len(pa) == len(span) == n_dim and min(ks) > 0 and min(st) > 0
            and grad.dtype.is_floating_point and grad.dtype.itemsize >= 2 and x.numel() != 0
            and grad.layout == torch.strided and grad.dim() == x.dim()
            and (grad.device.type == "cuda" or grad.device.type == "cpu" and PADDED_ON_CPU)):
        return NotImplemented
    counts = [-(-w // s) for w, s in zip(span, st)]  # (windows holding a position, at most, a dim)
    if math.prod(counts) > UNROLLED_WINDOW:
        return NotImplemented
    like = meta()
    in_sizes = list(x.shape[-n_dim:])

    def candidates(t: torch.Tensor, d: int, fill: int = 0) -> list[torch.Tensor]:
        """``t``'s values along spatial dim ``d`` at each input position's candidate windows, in
        increasing window order: element i of the k-th is t[(i + pad) // stride - (count - 1 - k)]
        (``fill`` past t's edges)."""
        dim, front = t.dim() - n_dim + d, counts[d] - 1
        # (past the last window: a candidate of the input's last position, ceil_mode's too)
        padded = F.pad(t, [0, 0] * (n_dim - 1 - d) + [front, counts[d] + 1], value=fill)
        spread = padded.unsqueeze(dim + 1).expand(*padded.shape[:dim + 1], st[d], *padded.shape[dim + 1:])
        spread = spread.flatten(dim, dim + 1)
        return [spread.narrow(dim, pa[d] + k * st[d], in_sizes[d]) for k in range(counts[d])]

    taken: dict[int, dict[tuple[int, ...], torch.Tensor]] = {}

    def at_candidates(t: torch.Tensor) -> dict[tuple[int, ...], torch.Tensor]:
        if id(t) not in taken:
            level = {(): t}
            for d in range(n_dim):
                level = {key + (k,): v for key, u in level.items() for k, v in enumerate(candidates(u, d))}
            taken[id(t)] = level
        return taken[id(t)]

    per_dim = []
    for d in range(n_dim):
        shape = [1] * n_dim
        shape[d] = grad.shape[grad.dim() - n_dim + d]
        numbers = torch.arange(shape[d], device=grad.device, dtype=torch.int32).reshape(shape)
        shape[d] = in_sizes[d]
        reach = torch.arange(in_sizes[d], device=grad.device, dtype=torch.int32).reshape(shape) + pa[d]
        options = []
        for o in candidates(numbers, d, fill=-1):
            options.append((o, (o >= 0) & (reach - o * st[d] < span[d])))
        per_dim.append(options)
    acc = torch.float32 if grad.dtype.itemsize < 4 else grad.dtype
    total = None
    for key in itertools.product(*[range(c) for c in counts]):
        choice = [per_dim[d][k] for d, k in enumerate(key)]
        valid = choice[0][1]
        for _, v in choice[1:]:
            valid = valid & v
        t = term(lambda t, key=key: at_candidates(t)[key], tuple(o for o, _ in choice), valid).to(acc)
        total = t + 0.0 if total is None else total + t  # (eager adds to a zero: 0 + -0.0 is 0.0)
    assert total is not None
    return _laid_out_as(total.to(grad.dtype), like)


def _avg_backward(n_dim: int, name: str) -> Callable[..., Any]:
    meta = _backward_meta(name)

    def decompose(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[Any], stride: Sequence[Any],
                  padding: Sequence[Any], ceil_mode: bool, count_include_pad: bool,
                  divisor_override: int | None) -> Any:
        ks, st, pa = _expand(kernel_size, n_dim), _expand(stride, n_dim), _expand(padding, n_dim)
        st = st or ks
        if meta is None:
            return NotImplemented
        if _tiles(x, grad, ks, st, pa, [1] * n_dim, ceil_mode):
            like = meta(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
            # eager: grad_input = 0 + grad_output / divisor, in float for 16-bit gradients
            acc = torch.float32 if grad.dtype.itemsize < 4 else grad.dtype
            share = grad.to(acc) / (divisor_override or math.prod(ks)) + 0.0
            result = _cover(_spread(share, ks), list(x.shape[-n_dim:])).to(grad.dtype)
            return _laid_out_as(result, like)
        if not len(ks) == len(st) == len(pa) == n_dim or n_dim == 3 and x.device.type == "cpu" \
                and x.dtype.itemsize < 4:  # (eager's CPU kernel has no 16-bit avg_pool3d: its error)
            return NotImplemented
        in_sizes = list(x.shape[-n_dim:])
        g = grad.to(torch.float32 if grad.dtype.itemsize < 4 else grad.dtype)

        def term(take: Take, windows: tuple[torch.Tensor, ...], valid: torch.Tensor) -> torch.Tensor:
            divisor = divisor_override or _divisor_of(list(windows), in_sizes, ks, st, pa, count_include_pad)
            return torch.where(valid, take(g) / divisor, 0.0)

        return _gathered(x, grad, ks, st, pa, ks, term, lambda: meta(
            grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override))
    return decompose


def _max_backward(n_dim: int, name: str) -> Callable[..., Any]:
    meta = _backward_meta(name)

    def decompose(grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[Any], stride: Sequence[Any],
                  padding: Sequence[Any], dilation: Sequence[Any], ceil_mode: bool, indices: torch.Tensor) -> Any:
        ks, st, pa = _expand(kernel_size, n_dim), _expand(stride, n_dim), _expand(padding, n_dim)
        st, di = st or ks, _expand(dilation, n_dim)
        if meta is None:
            return NotImplemented
        in_sizes = list(x.shape[-n_dim:])
        if _tiles(x, grad, ks, st, pa, di, ceil_mode):
            like = meta(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices)
            # each input position takes its window's gradient where the window's index is its own
            # position in the plane (eager adds it to a zero: 0 + -0.0 is 0.0)
            covered = [o * k for o, k in zip(grad.shape[-n_dim:], ks)]
            picked = torch.where(_spread(indices, ks) == _own(covered, in_sizes, grad.device),
                                 _spread(grad, ks), 0.0) + 0.0
            return _laid_out_as(_cover(picked, in_sizes), like)
        if not len(ks) == len(st) == len(pa) == len(di) == n_dim or indices.shape != grad.shape:
            return NotImplemented
        # Off by default: in a ResNet-18 training step on an H200 the scheduler fused the gather
        # into the stem's BatchNorm backward, a kernel of one program a channel that recomputed
        # the forward's max chain at each candidate: nearly all of a 247 ms step in float32, 532
        # of 550 ms in bfloat16 channels_last (Inductor's step: 13.5 ms), though with relu's
        # backward alone it beat ATen's kernel 1.4-2.6x (bench/cnn_step.py, bench/pooling.py).
        if not GATHERED_MAX_BACKWARD:
            return NotImplemented
        span = [(k - 1) * d + 1 for k, d in zip(ks, di)]
        at = _positions_of(indices, x, (ks, st, pa, di, ceil_mode))
        if at is not None:
            position = _in_window(in_sizes, ks, st, pa, di, grad.device)
            return _gathered(x, grad, ks, st, pa, span, lambda take, windows, valid: torch.where(
                position(windows, take(at), valid), take(grad), 0.0),
                lambda: meta(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices))
        own = _own(in_sizes, in_sizes, grad.device)
        # (a window whose index is the position's own holds it: a dilated window's gaps need no test)
        return _gathered(x, grad, ks, st, pa, span, lambda take, windows, valid: torch.where(
            valid & (take(indices) == own), take(grad), 0.0),
            lambda: meta(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices))
    return decompose


def _in_window(in_sizes: list[Any], ks: list[int], st: list[int], pa: list[int], di: list[int],
               device: torch.device) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor], torch.Tensor]:
    """``holds(windows, at, valid)``: where each candidate window (its number a dim) took its
    maximum at the input position: the window position ``at`` (-1: the window's first position
    inside the input) is the position's place in the window. int32 arithmetic of the position and
    the window's numbers; a dilated window's gaps hold no position."""
    n_dim = len(ks)
    positions = []
    for d in range(n_dim):
        shape = [1] * n_dim
        shape[d] = in_sizes[d]
        positions.append(torch.arange(in_sizes[d], device=device, dtype=torch.int32).reshape(shape))

    def holds(windows: tuple[torch.Tensor, ...], at: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        place = first_inside = None
        for d in range(n_dim):
            start = windows[d] * st[d] - pa[d]
            offset = positions[d] - start  # (>= 0 where valid)
            if di[d] > 1:
                valid = valid & (offset % di[d] == 0)
                offset = offset // di[d]
                inside = (-start).clamp(min=0)
                inside = (inside + di[d] - 1) // di[d]
            else:
                inside = (-start).clamp(min=0)
            inner = math.prod(ks[d + 1:])
            place = offset * inner if place is None else place + offset * inner
            first_inside = inside * inner if first_inside is None else first_inside + inside * inner
        assert place is not None and first_inside is not None
        return valid & (torch.where(at >= 0, at.to(torch.int32), first_inside) == place)
    return holds


def _own(sizes: list[Any], in_sizes: list[Any], device: torch.device) -> torch.Tensor:
    """Each position's flattened index in an input plane of ``in_sizes`` (eager's indices), over
    the first ``sizes`` of each dim."""
    own = None
    for d in range(len(sizes)):
        shape = [1] * len(sizes)
        shape[d] = sizes[d]
        coord = torch.arange(sizes[d], device=device).reshape(shape)
        own = coord if own is None else own * in_sizes[d] + coord
    assert own is not None
    return own
