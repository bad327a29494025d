"""``Ragged``: a batch of variable-length sequences stored packed, without padding.

Layout (the same as ``torch.nested``'s jagged layout and flash-attention's ``cu_seqlens``):

* ``values``  (T, *feature): every row of every sequence, back to back; T is the total length.
* ``offsets`` (B + 1,) int32/int64: sequence ``i`` is ``values[offsets[i]:offsets[i + 1]]``;
  ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == T``.
* ``max_length``: a host-side Python int, at least the longest row. Kernels and padding need it
  to size their grids and outputs; keeping it on the host means nobody syncs with the device
  to learn it.

``Ragged`` is a plain class with ``__slots__`` (not a tensor subclass) and a pytree node
(children: values, offsets; context: max_length), so ``torch.utils._pytree`` and anything built
on it sees its two tensors.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

from .ops import row_ids as _row_ids

OFFSET_DTYPES = (torch.int32, torch.int64)


class Ragged:
    """B variable-length sequences packed into ``values`` and delimited by ``offsets``.

    ``Ragged(values, offsets, max_length=None, *, validate=True)`` checks the layout and wraps
    the two tensors without copying. With ``max_length=None`` the longest row is computed (one
    host sync). ``validate=False`` skips the checks that read offsets' data (for internal fast
    paths that built the offsets themselves) but still checks ranks, dtypes and devices; inside
    a compiled function it also keeps ``max_length`` as given, its type and sign checked but not
    against the longest row (which would read offsets' data and pin the length with a guard).
    """

    __slots__ = ("values", "offsets", "_max_length", "_values_buffer", "_offsets_buffer")

    values: torch.Tensor
    offsets: torch.Tensor
    _max_length: int | None  # None only until read, when built in compiled code without one
    # The flat buffers ``values``/``offsets`` are views of when ``collate`` packed them; lets
    # ``to_device`` copy each shared buffer once. None for a Ragged that owns its tensors.
    _values_buffer: torch.Tensor | None
    _offsets_buffer: torch.Tensor | None

    def __init__(self, values: torch.Tensor, offsets: torch.Tensor, max_length: int | None = None, *,
                 validate: bool = True) -> None:
        if not validate and torch.compiler.is_compiling():
            # inside a compiled function (re-wrapping per-token scores with a batch's offsets):
            # operator.index or torch._check on max_length pins it with an equality guard (a
            # size Dynamo made symbolic is an int to its trace), and every batch with another
            # longest row compiled again. It is kept as given (None: found when first read) and
            # the offsets' data go unchecked; ranks, dtypes, devices and max_length's type and
            # sign are checked (`< 0` guards a symbolic length with s >= 0, which pins nothing)
            _check_structure(values, offsets, None)
            if max_length is not None:
                _check_length_type(max_length)
                if max_length < 0:  # a bound, not a pin: the guard a symbolic size gets is s >= 0
                    raise ValueError(f"max_length must be >= 0, got {max_length}")
            self.values, self.offsets, self._max_length = values, offsets, max_length
            self._values_buffer = self._offsets_buffer = None
            return
        _check_structure(values, offsets, max_length)
        if validate or max_length is None:
            longest = _check_offsets(values, offsets) if validate else _longest_row(offsets)
            if max_length is not None and max_length < longest:
                raise ValueError(f"max_length {max_length} is smaller than the longest row ({longest})")
            if max_length is None:
                max_length = longest
        self.values = values
        self.offsets = offsets
        self._max_length = int(max_length)
        _sizes_vary(values, offsets)
        self._values_buffer = None
        self._offsets_buffer = None

    @classmethod
    def _make(cls, values: Any, offsets: Any, max_length: int, values_buffer: torch.Tensor | None = None,
              offsets_buffer: torch.Tensor | None = None) -> Ragged:
        """Build without any check: pytree unflatten (whose leaves may be anything, e.g. shapes
        in a tree_map) and internal paths whose layout is correct by construction."""
        r = cls.__new__(cls)
        r.values, r.offsets, r._max_length = values, offsets, max_length
        _sizes_vary(values, offsets)
        r._values_buffer, r._offsets_buffer = values_buffer, offsets_buffer
        return r

    # ---- properties ---------------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """B, the number of sequences."""
        return self.offsets.shape[0] - 1

    @property
    def total_length(self) -> int:
        """T, the number of packed rows (the sum of all lengths)."""
        return self.values.shape[0]

    @property
    def max_length(self) -> int:
        """The longest row (an upper bound if the constructor was given a larger one)."""
        if self._max_length is None:  # (built inside a compiled function without one)
            self._max_length = _longest_row(self.offsets)
        return self._max_length

    @property
    def feature_shape(self) -> torch.Size:
        return self.values.shape[1:]

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    def lengths(self) -> torch.Tensor:
        """(B,) lengths of the sequences, in offsets' dtype and on their device."""
        return self.offsets.diff()

    def __len__(self) -> int:
        return self.batch_size

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        device = "" if self.device.type == "cpu" else f", device={self.device}"
        return (f"Ragged(B={self.batch_size}, T={self.total_length}, max_length={self.max_length}, "
                f"feature={tuple(self.feature_shape)}, dtype={dtype}{device})")

    # ---- rows ---------------------------------------------------------------------------------

    def __getitem__(self, index: int) -> torch.Tensor:
        """Row ``index``'s tensor (n_i, *feature), a view of ``values`` (reads two offsets)."""
        if isinstance(index, bool) or not hasattr(index, "__index__"):
            raise TypeError(f"Ragged indices must be ints, got {type(index).__name__}")
        index = operator.index(index)
        batch = self.batch_size
        if not -batch <= index < batch:
            raise IndexError(f"index {index} is out of range for a Ragged of {batch} rows")
        index %= batch
        start, end = self.offsets[index:index + 2].tolist()
        return self.values[start:end]

    def __iter__(self) -> Iterator[torch.Tensor]:
        # One host sync for all rows instead of one per __getitem__.
        return iter(self.to_list())

    def to_list(self) -> list[torch.Tensor]:
        """The B rows as views of ``values`` (one host sync to read the offsets)."""
        return list(self.values.split(self.lengths().tolist()))

    def row_ids(self) -> torch.Tensor:
        """(T,) int64: the sequence each packed row belongs to. No host sync: a binary search of
        each row's index in the offsets, which ember compiles into the kernel that uses it."""
        return _row_ids(self.offsets, self.values.shape[0])

    def positions(self) -> torch.Tensor:
        """(T,) int64: each packed row's position inside its sequence. With ``row_ids()`` it
        addresses a dense (B, N, ...) partner: ``dense[r.row_ids(), r.positions()]``."""
        return self._row_ids_and_positions()[1]

    def _row_ids_and_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        row_ids = self.row_ids()
        index = torch.arange(self.values.shape[0], device=self.offsets.device)
        return row_ids, index - self.offsets[:-1][row_ids].to(torch.int64)

    def to_padded(self, padding_value: float | int | bool = 0, max_length: int | None = None) -> torch.Tensor:
        """A dense (B, N, *feature) copy, N = ``max_length`` or ``self.max_length``, rows past a
        sequence's end filled with ``padding_value``. One scatter, no loop over the batch."""
        length = self.max_length if max_length is None else checked_length(max_length)
        if length < self.max_length:
            # self.max_length may be a loose upper bound: only the true longest row decides.
            longest = _longest_row(self.offsets)
            if length < longest:
                raise ValueError(f"max_length {length} is smaller than the longest row ({longest})")
        out = self.values.new_full((self.batch_size, length, *self.feature_shape), padding_value)
        row_ids, positions = self._row_ids_and_positions()
        out.index_put_((row_ids, positions), self.values)
        return out

    # ---- torch.nested -------------------------------------------------------------------------

    @classmethod
    def from_nested(cls, nested: torch.Tensor) -> Ragged:
        """Wrap a ``torch.nested`` tensor of ``layout=torch.jagged`` (ragged dim 1) without
        copying. One with holes (offsets plus lengths) is compacted first, which copies."""
        if not isinstance(nested, torch.Tensor):
            raise TypeError(f"from_nested expects a torch.nested tensor, got {type(nested).__name__}")
        if not nested.is_nested or nested.layout != torch.jagged:
            raise ValueError(f"from_nested expects a nested tensor with layout=torch.jagged, got layout "
                             f"{nested.layout}{'' if nested.is_nested else ' (not nested)'}")
        if getattr(nested, "_ragged_idx", 1) != 1:
            raise ValueError(f"from_nested needs the ragged dimension at dim 1, this nested tensor has it "
                             f"at dim {nested._ragged_idx}; transpose it back first")
        if nested.lengths() is not None:
            nested = nested.contiguous()
        max_length = getattr(nested, "_maybe_max_seqlen", None)
        return cls(nested.values(), nested.offsets(), None if max_length is None else int(max_length))

    def to_nested(self) -> torch.Tensor:
        """A jagged ``torch.nested`` view of the same values and offsets (no copy); the host-side
        max_length is handed over as its cached max_seqlen, so it needs no sync either (if this
        Ragged was given a loose upper bound, the nested tensor caches that bound)."""
        return torch.nested.nested_tensor_from_jagged(self.values, self.offsets, max_seqlen=self.max_length)

    # ---- moving and copying -------------------------------------------------------------------

    def to(self, device_or_dtype: torch.device | str | torch.dtype, non_blocking: bool = False) -> Ragged:
        """Values cast to a dtype (offsets stay as they are), or both tensors moved to a device.
        For a batch from ``collate``, ``ragged.to_device`` copies shared buffers only once."""
        # (r.to(tensor) cast the offsets to the tensor's dtype too: float16 offsets, silently; and
        # r.to("cuda", torch.half) failed in Tensor.to with non_blocking=torch.float16)
        if isinstance(device_or_dtype, bool) or not isinstance(device_or_dtype, (torch.dtype, torch.device, str, int)):
            raise TypeError(f"Ragged.to takes a device or a dtype, got {type(device_or_dtype).__name__}")
        if not isinstance(non_blocking, bool):
            raise TypeError(f"Ragged.to: non_blocking= takes True or False, got {non_blocking!r} (to move and "
                            f"cast, call r.to(device).to(dtype))")
        if isinstance(device_or_dtype, torch.dtype):
            values = self.values.to(device_or_dtype)
            if values is self.values:
                return self
            return Ragged._make(values, self.offsets, self.max_length, None, self._offsets_buffer)
        values = self.values.to(device_or_dtype, non_blocking=non_blocking)
        offsets = self.offsets.to(device_or_dtype, non_blocking=non_blocking)
        if values is self.values and offsets is self.offsets:
            return self  # already there; like Tensor.to, no copy
        return Ragged._make(values, offsets, self.max_length)

    def pin_memory(self) -> Ragged:
        """Page-locked copies of both tensors, for asynchronous host-to-device copies. Needs an
        accelerator: torch raises on a CPU-only build. The fields of one ``collate`` batch (as
        ``DataLoader(pin_memory=True)`` pins them, one by one) share one pinned copy of its
        buffer, so the batch still reaches the device in one copy."""
        from .collate import pin_packed  # (collate builds on this module)

        packed = pin_packed(self)
        if packed is not None:
            return packed
        return Ragged._make(self.values.pin_memory(), self.offsets.pin_memory(), self.max_length)

    def clone(self) -> Ragged:
        """Copies of both tensors, owning their memory (no longer views of a collate buffer)."""
        return Ragged._make(self.values.clone(), self.offsets.clone(), self.max_length)


def _sizes_vary(values: Any, offsets: Any) -> None:
    """The packed length T changes every batch, and so may the batch size B (a token-budget
    sampler, an epoch's last batch): tell torch.compile so up front, so the first compiled graph
    is already symbolic in both and later batches reuse it (no recompile). Kernels index the
    offsets with a symbolic B, and a dense partner of another row count still gathers
    (passes/ragged.py)."""
    if torch.compiler.is_compiling():
        return
    if isinstance(values, torch.Tensor) and values.dim() > 0:
        torch._dynamo.maybe_mark_dynamic(values, 0)
    if isinstance(offsets, torch.Tensor) and offsets.dim() == 1:
        torch._dynamo.maybe_mark_dynamic(offsets, 0)


def _check_structure(values: Any, offsets: Any, max_length: Any) -> None:
    """The checks that need no data: types, ranks, dtypes, devices, max_length's sign."""
    for name, tensor in (("values", values), ("offsets", offsets)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"Ragged {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if values.dim() == 0:
        raise ValueError("Ragged values must have at least one dimension (the packed rows), got a 0-d tensor")
    if offsets.dim() != 1:
        raise ValueError(f"Ragged offsets must be 1-D, got shape {tuple(offsets.shape)}")
    if offsets.dtype not in OFFSET_DTYPES:
        raise ValueError(f"Ragged offsets must be int32 or int64, got {offsets.dtype}")
    if offsets.shape[0] < 1:
        raise ValueError("Ragged offsets must have at least 1 element (B + 1 for B sequences), got 0")
    if offsets.device != values.device:
        raise ValueError(f"Ragged offsets are on {offsets.device} but values are on {values.device}")
    if max_length is not None:
        checked_length(max_length)


def _check_length_type(max_length: Any) -> None:
    """TypeError unless ``max_length`` is an integer (a bool is not). Reads no value: inside
    compiled code, a size Dynamo made symbolic passes without a guard."""
    if isinstance(max_length, bool) or not hasattr(type(max_length), "__index__"):
        raise TypeError(f"max_length must be an int or None, got {type(max_length).__name__}")


def checked_length(max_length: Any) -> Any:
    """``max_length`` as an int (any integer: numpy's too, as from a sampler's lengths array;
    a size Dynamo made symbolic as it is), or TypeError or ValueError naming what is wrong."""
    if isinstance(max_length, torch.SymInt):
        return max_length
    _check_length_type(max_length)
    max_length = operator.index(max_length)
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0, got {max_length}")
    return max_length


def _check_offsets(values: torch.Tensor, offsets: torch.Tensor) -> int:
    """Check offsets' data in one host sync; returns the longest row."""
    rows = values.shape[0]
    offsets = offsets.to(torch.int64)
    if offsets.shape[0] == 1:
        first = last = int(offsets[0])
        longest = 0
    else:
        steps = offsets.diff()
        decreasing = steps < 0
        bad = torch.argmax(decreasing.to(torch.uint8))  # the first decreasing step, if any
        summary = torch.stack([offsets[0], offsets[-1], steps.max(), decreasing.any().to(offsets.dtype), bad,
                               offsets[bad], offsets[bad + 1]])
        first, last, longest, any_bad, bad_i, before, after = summary.tolist()
        if first == 0 and any_bad:
            raise ValueError(f"Ragged offsets must be non-decreasing, but offsets[{bad_i + 1}] = {after} "
                             f"< offsets[{bad_i}] = {before}")
    if first != 0:
        raise ValueError(f"Ragged offsets must start at 0, got offsets[0] = {first}")
    if last != rows:
        raise ValueError(f"Ragged offsets end at {last} but values has {rows} rows")
    return longest


def _longest_row(offsets: torch.Tensor) -> int:
    return int(offsets.diff().max()) if offsets.shape[0] > 1 else 0


def _flatten(r: Ragged) -> tuple[list[Any], int]:
    return [r.values, r.offsets], r.max_length


def _unflatten(children: Any, max_length: int) -> Ragged:
    values, offsets = children
    return Ragged._make(values, offsets, max_length)


def _flatten_with_keys(r: Ragged) -> tuple[list[tuple[Any, Any]], int]:
    return [(pytree.GetAttrKey("values"), r.values), (pytree.GetAttrKey("offsets"), r.offsets)], r.max_length


if Ragged not in pytree.SUPPORTED_NODES:  # a module reload must not register twice
    pytree.register_pytree_node(Ragged, _flatten, _unflatten, serialized_type_name="ember.ragged.Ragged",
                                flatten_with_keys_fn=_flatten_with_keys)
