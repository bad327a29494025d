"""A DataLoader ``collate_fn`` that packs variable-length fields into ``Ragged``, and ``to_device``.

Why one buffer: a batch of many small variable-length fields would otherwise reach the GPU as
one small host-to-device copy per field (plus one per offsets tensor), each with its own launch
latency and, unless pinned, its own staging copy. ``collate`` instead allocates ONE flat byte
buffer (pinned when pinning) with a region per dtype, copies every ragged field's values into a
slice of its dtype's region, writes all offsets into the int64 region (the buffer's first), and
builds each ``Ragged`` as views of those regions. Each ``Ragged`` keeps a reference to the
regions it views, so ``to_device`` can copy the buffer once and rebuild the views on the device:
one copy for the whole ragged part of the batch, however many fields and dtypes it has.

    loader = DataLoader(dataset, batch_size=32, collate_fn=ragged.collate)
    for batch in loader:
        batch = ragged.to_device(batch, "cuda")       # one non-blocking copy for the ragged part

``DataLoader(..., pin_memory=True)`` pins the batch field by field in the main process;
``Ragged.pin_memory`` pins the buffer once for all the fields that view it, so the pinned batch
is one buffer still.

A step captured with ``ember.cuda_graph`` takes the batch as it is, in pinned host memory, and
copies it into its buffers itself (one copy: the offsets come first, so a batch's bytes up to its
values' end are a prefix of the capture's layout).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data
from torch.utils.weak import WeakIdKeyDictionary

from .tensor import Ragged

_NUMBERS = (bool, int, float)


@dataclass
class _RaggedField:
    """One field to pack: where its values go in the buffer of its (device, dtype)."""
    key: Hashable
    tensors: list[torch.Tensor]
    lengths: list[int]
    start: int = 0   # element offset of the values in their buffer
    offsets_start: int = 0   # element offset of the offsets in the int64 buffer

    @property
    def buffer_key(self) -> tuple[torch.device, torch.dtype]:
        return self.tensors[0].device, self.tensors[0].dtype

    @property
    def values_shape(self) -> tuple[int, ...]:
        return (sum(self.lengths), *self.tensors[0].shape[1:])


def collate(batch: Sequence[Any], *, ragged_fields: Iterable[Hashable] | None = None,
            pin_memory: bool | None = None) -> Any:
    """Collate a list of samples (tuples or dicts of tensors or Python numbers) into a batch.

    * Tensors of equal shape in every sample are stacked (as ``default_collate`` does); Python
      numbers become a tensor (bool, int64 or float64); any other objects (e.g. strings) are
      kept as a list.
    * Fields named in ``ragged_fields`` (indices for tuples, keys for dicts) become ``Ragged``;
      with ``ragged_fields=None``, so does every tensor field whose first dimension differs
      between samples (the other dimensions must agree).
    * All ragged fields are packed into one flat buffer (a region per dtype, their offsets in the
      int64 region), and the ``Ragged`` objects are views of it; see the module docstring and
      ``to_device``.
    * ``pin_memory=None`` pins host buffers (and dense fields) if ``torch.cuda.is_available()``,
      except in a DataLoader's worker process (pass ``pin_memory=True`` to the DataLoader);
      ``True`` without an accelerator warns and does not pin (pinning raises there).

    Returns the samples' container type: a tuple (or list, or namedtuple) or a dict. Inputs are
    copied without autograd history: this is for data loading.
    """
    if not isinstance(batch, (list, tuple)):  # (a string or a generator was a ValueError)
        raise TypeError(f"collate expects a list of samples, got {type(batch).__name__}")
    if not batch:
        raise ValueError("collate expects a non-empty list of samples")
    if pin_memory is not None and not isinstance(pin_memory, bool):  # (pin_memory="no" pinned)
        raise TypeError(f"collate: pin_memory= takes True, False or None, got {pin_memory!r}")
    pin = _should_pin(pin_memory)
    first = batch[0]
    if isinstance(first, Mapping):
        keys: list[Hashable] = list(first.keys())
        for i, sample in enumerate(batch):
            if not isinstance(sample, Mapping):
                raise TypeError(f"collate: sample {i} is a {type(sample).__name__}, sample 0 a dict")
            if sample.keys() != first.keys():  # (in any order, as default_collate takes them)
                raise ValueError(f"collate: sample {i} has keys {list(sample.keys())}, sample 0 has {keys}")
    elif isinstance(first, (tuple, list)):
        keys = list(range(len(first)))
        for i, sample in enumerate(batch):
            if not isinstance(sample, (tuple, list)):
                raise TypeError(f"collate: sample {i} is a {type(sample).__name__}, sample 0 a {type(first).__name__}")
            if len(sample) != len(keys):
                raise ValueError(f"collate: sample {i} has {len(sample)} fields, sample 0 has {len(keys)}")
    else:
        raise TypeError(f"collate: samples must be tuples, lists or dicts, got {type(first).__name__}")
    wanted = _normalize_fields(ragged_fields, keys, positional=not isinstance(first, Mapping))

    out: dict[Hashable, Any] = {}
    to_pack: list[_RaggedField] = []
    with torch.no_grad():
        for key in keys:
            items = [sample[key] for sample in batch]
            field = _collate_field(key, items, ragged=key in wanted, auto=ragged_fields is None, pin=pin)
            if isinstance(field, _RaggedField):
                to_pack.append(field)
            else:
                out[key] = field
        out.update(_pack(to_pack, len(batch), pin))

    if isinstance(first, Mapping):
        return {key: out[key] for key in keys}
    fields = [out[key] for key in keys]
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*fields)
    return type(first)(fields) if isinstance(first, list) else tuple(fields)


def to_device(batch: Any, device: torch.device | str, non_blocking: bool = True, *, copy: bool = False) -> Any:
    """Move a collated batch (tuples, lists, dicts of tensors and ``Ragged``) to ``device``.

    The packed buffer shared by ``Ragged`` fields is copied once (all its dtypes at once), not
    once per field, and the fields are rebuilt as views of the copy, so sharing survives the
    move. Plain tensors and unpacked ``Ragged`` move on their own. ``copy=True`` copies even when
    already on ``device`` (e.g. to detach the batch from a worker's buffers).
    """
    device = torch.device(device)
    moved: dict[int, torch.Tensor] = {}  # storage address -> the whole storage's bytes moved

    def move(tensor: torch.Tensor, buffer: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if buffer is None or not _is_view_of(tensor, buffer):
            return tensor.to(device, non_blocking=non_blocking, copy=copy), None
        address = buffer.untyped_storage().data_ptr()
        if address not in moved:  # the whole storage (every dtype's region) in one copy
            moved[address] = _storage_bytes(buffer).to(device, non_blocking=non_blocking, copy=copy)
        return _view_in(moved[address], tensor, buffer)

    def visit(x: Any) -> Any:
        if isinstance(x, Ragged):
            values, values_buffer = move(x.values, x._values_buffer)
            offsets, offsets_buffer = move(x.offsets, x._offsets_buffer)
            return Ragged._make(values, offsets, x.max_length, values_buffer, offsets_buffer)
        if isinstance(x, torch.Tensor):
            return x.to(device, non_blocking=non_blocking, copy=copy)
        if isinstance(x, Mapping):
            return {k: visit(v) for k, v in x.items()}
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(visit(v) for v in x))
        if isinstance(x, (tuple, list)):
            return type(x)(visit(v) for v in x)
        return x

    return visit(batch)


def _collate_field(key: Hashable, items: list[Any], *, ragged: bool, auto: bool, pin: bool) -> Any:
    """A dense tensor, a list, or a ``_RaggedField`` still to be packed."""
    tensors = [x for x in items if isinstance(x, torch.Tensor)]
    if not tensors:
        if all(isinstance(x, _NUMBERS) for x in items):
            if ragged:
                raise ValueError(f"collate: field {key!r} holds numbers, it cannot be ragged")
            return _maybe_pin(torch.tensor(items, dtype=_number_dtype(items)), pin)
        if ragged:
            raise TypeError(f"collate: ragged field {key!r} must hold tensors, got {type(items[0]).__name__}")
        return items  # strings, paths, ...: kept as a list, like default_collate
    if len(tensors) != len(items):
        odd = next(x for x in items if not isinstance(x, torch.Tensor))
        raise TypeError(f"collate: field {key!r} mixes tensors with {type(odd).__name__}")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.dtype != first.dtype:
            raise ValueError(f"collate: field {key!r} is {t.dtype} in sample {i}, {first.dtype} in sample 0")
        if t.device != first.device:
            raise ValueError(f"collate: field {key!r} is on {t.device} in sample {i}, {first.device} in sample 0")

    same_shape = all(t.shape == first.shape for t in tensors)
    if not ragged and (same_shape or not auto):
        if not same_shape:
            shapes = sorted({tuple(t.shape) for t in tensors})
            raise ValueError(f"collate: dense field {key!r} has different shapes {shapes[:4]} across samples; "
                             f"name it in ragged_fields to pack it as Ragged")
        out = torch.empty((len(tensors), *first.shape), dtype=first.dtype, device=first.device,
                          pin_memory=pin and first.device.type == "cpu")
        return torch.stack(tensors, out=out)
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise ValueError(f"collate: ragged field {key!r} has a 0-d tensor in sample {i}")
        if t.shape[1:] != first.shape[1:]:
            raise ValueError(f"collate: field {key!r} has rows of shape {tuple(t.shape[1:])} in sample {i} but "
                             f"{tuple(first.shape[1:])} in sample 0; only the first dimension may vary")
    return _RaggedField(key, tensors, [t.shape[0] for t in tensors])


_ALIGN = 16  # bytes: each dtype's region of a device's buffer starts at a multiple of this


def _pack(fields: list[_RaggedField], batch_size: int, pin: bool) -> dict[Hashable, Ragged]:
    """Copy every field into one buffer per device: the offsets first (the int64 region), then a
    region per dtype for the values. The regions are typed views of the device's one byte
    buffer, so moving the batch is one copy (``to_device``). Offsets first: their place does not
    depend on the lengths, so with one ragged field the bytes up to the values' end are a prefix
    of the same layout with more rows, and ``ember.cuda_graph`` copies them into its buffers at
    once."""
    sizes: dict[tuple[torch.device, torch.dtype], int] = {}
    offsets_by_device: dict[torch.device, list[int]] = {}
    for f in fields:  # all offsets of a device first, contiguous, so they are written in one copy ...
        device = f.buffer_key[0]
        key = (device, torch.int64)
        f.offsets_start = sizes.get(key, 0)
        sizes[key] = f.offsets_start + batch_size + 1
        host = offsets_by_device.setdefault(device, [])
        host.append(0)
        for n in f.lengths:
            host.append(host[-1] + n)
    for f in fields:  # ... then the values
        f.start = sizes.get(f.buffer_key, 0)
        sizes[f.buffer_key] = f.start + math.prod(f.values_shape)

    places: dict[tuple[torch.device, torch.dtype], int] = {}  # byte offset of each region
    ends: dict[torch.device, int] = {}
    for (device, dtype), n in sizes.items():
        start = -(-ends.get(device, 0) // _ALIGN) * _ALIGN
        places[device, dtype] = start
        ends[device] = start + n * dtype.itemsize
    whole = {device: torch.empty(end, dtype=torch.uint8, device=device, pin_memory=pin and device.type == "cpu")
             for device, end in ends.items()}
    buffers = {(device, dtype): whole[device][places[device, dtype]:places[device, dtype] + n * dtype.itemsize]
               .view(dtype) for (device, dtype), n in sizes.items()}
    for device, host in offsets_by_device.items():
        start = min(f.offsets_start for f in fields if f.buffer_key[0] == device)
        buffers[device, torch.int64][start:start + len(host)].copy_(torch.tensor(host, dtype=torch.int64))

    out: dict[Hashable, Ragged] = {}
    for f in fields:
        values_buffer = buffers[f.buffer_key]
        offsets_buffer = buffers[f.buffer_key[0], torch.int64]
        values = values_buffer[f.start:f.start + math.prod(f.values_shape)].view(f.values_shape)
        torch.cat(f.tensors, out=values)
        offsets = offsets_buffer[f.offsets_start:f.offsets_start + batch_size + 1]
        out[f.key] = Ragged._make(values, offsets, max(f.lengths), values_buffer, offsets_buffer)
    return out


def _storage_bytes(buffer: torch.Tensor) -> torch.Tensor:
    """The whole storage ``buffer`` views, as bytes: every dtype's region of a collate buffer."""
    return torch.empty(0, dtype=torch.uint8, device=buffer.device).set_(buffer.untyped_storage())


def _view_in(whole: torch.Tensor, tensor: torch.Tensor, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``tensor`` and the region ``buffer`` it views, rebuilt as views of ``whole``, a copy of
    their storage's bytes (on another device, or pinned)."""
    start = buffer.storage_offset() * buffer.element_size()
    new = whole[start:start + buffer.numel() * buffer.element_size()].view(buffer.dtype)
    offset = new.storage_offset() + tensor.storage_offset() - buffer.storage_offset()
    return new.as_strided(tensor.shape, tensor.stride(), offset), new


# pinned copies of collate buffers, by the offsets region every Ragged of a batch shares: a
# DataLoader(pin_memory=True) pins a batch field by field (Ragged.pin_memory each), and the
# second field must land in the first one's pinned copy, or the batch is no longer one buffer
_PINNED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pin_packed(r: Ragged) -> Ragged | None:
    """``r`` rebuilt over a pinned copy of the collate buffer it views, pinned once for all the
    ``Ragged`` of its batch (pinning a batch twice, while the first pinned copy lives, gives that
    copy again); None if ``r`` views no host collate buffer."""
    values_buffer, offsets_buffer = r._values_buffer, r._offsets_buffer
    if (values_buffer is None or offsets_buffer is None or offsets_buffer.device.type != "cpu"
            or not _is_view_of(r.values, values_buffer) or not _is_view_of(r.offsets, offsets_buffer)
            or values_buffer.untyped_storage().data_ptr() != offsets_buffer.untyped_storage().data_ptr()):
        return None
    whole = _PINNED.get(offsets_buffer)
    if whole is None:
        whole = _storage_bytes(offsets_buffer)
        if not whole.is_pinned():
            whole = whole.pin_memory()
        _PINNED[offsets_buffer] = whole
    values, new_values_buffer = _view_in(whole, r.values, values_buffer)
    offsets, new_offsets_buffer = _view_in(whole, r.offsets, offsets_buffer)
    return Ragged._make(values, offsets, r.max_length, new_values_buffer, new_offsets_buffer)


def _is_view_of(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    return (tensor.dtype == buffer.dtype and tensor.device == buffer.device and buffer.dim() == 1
            and buffer.is_contiguous()
            and tensor.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr())


def _should_pin(pin_memory: bool | None) -> bool:
    if pin_memory is None:
        # not in a DataLoader's worker: a worker forked from a process that has initialized CUDA
        # cannot pin (CUDA raises "initialization error"), and its batch reaches the main process
        # through shared memory, unpinned, anyway (DataLoader(pin_memory=True) pins it there)
        return torch.cuda.is_available() and torch.utils.data.get_worker_info() is None
    if pin_memory and not _accelerator_available():
        warnings.warn("collate: pin_memory=True but no accelerator is available; not pinning", stacklevel=3)
        return False
    return bool(pin_memory)


def _accelerator_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def _maybe_pin(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    return tensor.pin_memory() if pin else tensor


def _number_dtype(items: list[Any]) -> torch.dtype:
    if all(isinstance(x, bool) for x in items):
        return torch.bool
    if all(isinstance(x, int) for x in items):
        return torch.int64
    return torch.float64


def _normalize_fields(fields: Iterable[Hashable] | None, keys: list[Hashable], positional: bool) -> set[Hashable]:
    if fields is None:
        return set()
    if isinstance(fields, (str, int)):
        fields = [fields]
    if not isinstance(fields, Iterable):  # (ragged_fields=1.0 failed as "'float' object is not iterable")
        raise TypeError(f"collate: ragged_fields= takes a field (index or key) or a list of them, got {fields!r}")
    out: set[Hashable] = set()
    for field in fields:
        if positional:
            if isinstance(field, bool) or not isinstance(field, int):
                raise TypeError(f"collate: ragged_fields of tuple samples must be indices, got {field!r}")
            if not -len(keys) <= field < len(keys):
                raise ValueError(f"collate: ragged field index {field} is out of range for {len(keys)} fields")
            field %= len(keys)
        elif field not in keys:
            raise ValueError(f"collate: ragged field {field!r} is not a key of the samples {keys}")
        out.add(field)
    return out

