"""Building a ``Ragged`` from a list of tensors or from a padded batch."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import accumulate

import torch

from .tensor import OFFSET_DTYPES, Ragged


def from_list(tensors: Sequence[torch.Tensor], *, offsets_dtype: torch.dtype = torch.int64,
              feature_shape: Sequence[int] | None = None, dtype: torch.dtype | None = None,
              device: torch.device | str | None = None) -> Ragged:
    """Pack tensors of shape (n_i, *feature) into one Ragged with a single ``torch.cat``.

    Lengths are read from the shapes, so offsets and max_length are built on the host without a
    sync. An empty list needs ``feature_shape`` and ``dtype`` (and optionally ``device``) to know
    what it is a batch of; when given for a non-empty list they must match the tensors.
    """
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"from_list expects a list or tuple of tensors, got {type(tensors).__name__}")
    _check_offsets_dtype(offsets_dtype, "from_list")
    # (dtype="float32" was reported as "dtype=float32 but the tensors are torch.float32", and
    # feature_shape=3 or (-3,) failed inside torch.empty)
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"from_list: dtype= must be a torch.dtype, got {dtype!r}")
    if feature_shape is not None:
        feature_shape = _checked_shape(feature_shape)
    if device is not None:
        device = _checked_device(device)
    if not tensors:
        if feature_shape is None or dtype is None:
            raise ValueError("from_list of an empty list needs feature_shape= and dtype= to know the row shape")
        values = torch.empty((0, *feature_shape), dtype=dtype, device=device)
        return Ragged._make(values, torch.zeros(1, dtype=offsets_dtype, device=device), 0)

    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"from_list: item {i} is a {type(t).__name__}, not a torch.Tensor")
        if t.dim() == 0:
            raise ValueError(f"from_list: item {i} is a 0-d tensor; rows need shape (n_i, *feature)")
        if t.shape[1:] != first.shape[1:]:
            raise ValueError(f"from_list: item {i} has feature shape {tuple(t.shape[1:])}, item 0 has "
                             f"{tuple(first.shape[1:])}")
        if t.dtype != first.dtype:
            raise ValueError(f"from_list: item {i} has dtype {t.dtype}, item 0 has {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"from_list: item {i} is on {t.device}, item 0 on {first.device}")
    if feature_shape is not None and tuple(feature_shape) != tuple(first.shape[1:]):
        raise ValueError(f"from_list: feature_shape={tuple(feature_shape)} but the tensors have "
                         f"{tuple(first.shape[1:])}")
    if dtype is not None and dtype != first.dtype:
        raise ValueError(f"from_list: dtype={dtype} but the tensors are {first.dtype}")
    if device is not None and device != first.device:
        raise ValueError(f"from_list: device={device} but the tensors are on {first.device}")

    lengths = [t.shape[0] for t in tensors]
    _check_fits(sum(lengths), offsets_dtype, "from_list")
    offsets = torch.tensor([0, *accumulate(lengths)], dtype=offsets_dtype, device=first.device)
    return Ragged._make(torch.cat(list(tensors)), offsets, max(lengths))


def from_padded(padded: torch.Tensor, lengths: torch.Tensor | Sequence[int], *,
                offsets_dtype: torch.dtype = torch.int64) -> Ragged:
    """Keep the first ``lengths[i]`` rows of each item of a padded (B, N, *feature) batch.

    Vectorized: a (B, N) mask ``arange(N) < lengths[:, None]`` selects the rows in one indexing
    op; a lengths tensor costs one host sync (to check it and learn max_length), a list none.
    """
    if not isinstance(padded, torch.Tensor):
        raise TypeError(f"from_padded expects a tensor, got {type(padded).__name__}")
    if padded.dim() < 2:
        raise ValueError(f"from_padded expects a padded (B, N, *feature) tensor, got shape {tuple(padded.shape)}")
    _check_offsets_dtype(offsets_dtype, "from_padded")
    batch, width = padded.shape[0], padded.shape[1]

    if isinstance(lengths, torch.Tensor):
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise TypeError(f"from_padded: lengths must be integers, got {lengths.dtype}")
        if lengths.dim() != 1 or lengths.shape[0] != batch:
            raise ValueError(f"from_padded: lengths must have shape ({batch},) for a batch of {batch}, "
                             f"got {tuple(lengths.shape)}")
        lengths = lengths.to(device=padded.device, dtype=torch.int64)
        summary = torch.stack([lengths.min(), lengths.max(), lengths.sum()]) if batch else torch.zeros(3)
        low, high, total = (int(x) for x in summary.tolist())
    else:
        if type(lengths).__module__ == "numpy" and getattr(lengths, "ndim", None) == 1:
            # (a sampler's lengths array)
            if lengths.dtype.kind not in "iu":
                raise TypeError(f"from_padded: lengths must be integers, got a numpy array of {lengths.dtype}")
            lengths = lengths.tolist()
        if not isinstance(lengths, (list, tuple)) or not all(
                hasattr(type(n), "__index__") and not isinstance(n, (bool, torch.Tensor)) for n in lengths):
            raise TypeError("from_padded: lengths must be a tensor or a list of ints")
        lengths = [operator.index(n) for n in lengths]
        if len(lengths) != batch:
            raise ValueError(f"from_padded: {len(lengths)} lengths for a batch of {batch}")
        low, high, total = (min(lengths), max(lengths), sum(lengths)) if batch else (0, 0, 0)
        lengths = torch.tensor(lengths, dtype=torch.int64, device=padded.device)
    if low < 0:
        raise ValueError(f"from_padded: lengths must be >= 0, got {low}")
    if high > width:
        raise ValueError(f"from_padded: a length of {high} exceeds the padded size {width}")
    _check_fits(total, offsets_dtype, "from_padded")

    mask = torch.arange(width, device=padded.device) < lengths[:, None]
    offsets = torch.zeros(batch + 1, dtype=offsets_dtype, device=padded.device)
    offsets[1:] = lengths.cumsum(0)
    return Ragged._make(padded[mask], offsets, high)


def _check_offsets_dtype(offsets_dtype: object, api: str) -> None:
    # (offsets_dtype="int64" was a ValueError reading "got int64")
    if not isinstance(offsets_dtype, torch.dtype):
        raise TypeError(f"{api}: offsets_dtype= must be torch.int32 or torch.int64, got {offsets_dtype!r}")
    if offsets_dtype not in OFFSET_DTYPES:
        raise ValueError(f"{api}: offsets_dtype must be int32 or int64, got {offsets_dtype}")


def _check_fits(total: int, offsets_dtype: torch.dtype, api: str) -> None:
    """T must fit the offsets' dtype: torch.tensor raised its own overflow error, and a cumsum
    copied into int32 offsets would wrap around silently."""
    if total > torch.iinfo(offsets_dtype).max:
        raise ValueError(f"{api}: {total} rows do not fit {offsets_dtype} offsets; use offsets_dtype=torch.int64")


def _checked_shape(shape: object) -> tuple[int, ...]:
    """``feature_shape`` as a tuple of sizes >= 0 (torch.Size, a list or tuple of ints)."""
    if not isinstance(shape, (list, tuple)) or not all(
            hasattr(type(n), "__index__") and not isinstance(n, bool) for n in shape):
        raise TypeError(f"from_list: feature_shape= must be a tuple of ints, got {shape!r}")
    sizes = tuple(operator.index(n) for n in shape)
    if any(n < 0 for n in sizes):
        raise ValueError(f"from_list: feature_shape= must have sizes >= 0, got {sizes}")
    return sizes


def _checked_device(device: object) -> torch.device:
    if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
        raise TypeError(f"from_list: device= must be a torch.device or a device string, got {device!r}")
    try:
        return torch.device(device)
    except RuntimeError as e:  # (torch's message lists every device type)
        raise ValueError(f"from_list: device={device!r} is not a device") from e
