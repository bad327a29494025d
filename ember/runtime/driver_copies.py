"""Asynchronous copies through the CUDA driver, for ``ember.cuda_graph``'s copy into its buffers.

A captured step replays in about 25 µs of GPU time, so its host path must stay below that for
the GPU to be fed back to back. PyTorch's ``copy_`` costs 15-30 µs of host time a call on the
GPU machines' hosts (dispatch, stream and pinned-memory bookkeeping), and a cuda-python call a
few µs of argument conversion; the driver's copy called through ctypes with fixed argument types
costs well under one. The copies into a capture's static buffers go that way, on PyTorch's
current stream, which the replay then runs on. They name their direction (``cuMemcpyHtoDAsync``,
``cuMemcpyDtoDAsync``): ``cuMemcpyAsync`` first looks up where both addresses live, 2.5 µs more
of host time a copy measured alone on an H200's host (``bench/graph_copy_probe.py``; within a
whole GIoU step the difference was lost in the host's noise).

A host source must outlive its asynchronous copy (from pinned memory the copy runs later, and
the tensor's block may be handed out again once the caller drops it): like PyTorch's host
allocator, ``DriverCopies`` keeps the host tensors alive until an event recorded after their
copies has completed. One event covers the sources of ``RELEASE_EVERY`` calls: an event record
and the queries of its completion cost 2-3 µs of host time a call on an H200's host, where one
per eight calls costs a fraction of one, and holding a few batches' sources longer is harmless.
"""

from __future__ import annotations

import ctypes
import functools
from collections import deque
from typing import Any

import torch

from .backend import BuildError
from .cuda_backend import _current_stream, make_context_current

Copy = tuple[int, int, int, bool]  # (device destination address, source address, bytes, source on the host)
RELEASE_EVERY = 8  # calls whose host sources one event covers

_SUCCESS, _NOT_READY, _INVALID_CONTEXT = 0, 600, 201  # CUresult values
_EVENT_DISABLE_TIMING = 2


@functools.cache
def _libcuda() -> Any:
    """The driver library with the argument types of the few calls made here."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise BuildError(f"the CUDA driver library cannot be loaded ({e})") from None
    u64, ptr = ctypes.c_uint64, ctypes.c_void_p
    for name, args in (("cuMemcpyHtoDAsync_v2", [u64, u64, ctypes.c_size_t, ptr]),
                       ("cuMemcpyDtoDAsync_v2", [u64, u64, ctypes.c_size_t, ptr]), ("cuEventRecord", [ptr, ptr]),
                       ("cuEventQuery", [ptr]), ("cuEventCreate", [ctypes.POINTER(ptr), ctypes.c_uint]),
                       ("cuEventSynchronize", [ptr])):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


def _check(err: int, what: str) -> None:
    if err != _SUCCESS:
        raise RuntimeError(f"{what} failed: CUresult {err}")


class DriverCopies:
    """Copies to ``device`` on its current stream; host sources kept alive."""

    def __init__(self, device: torch.device):
        self.lib = _libcuda()
        self.device = device.index if device.index is not None else torch.cuda.current_device()
        self._free: list[ctypes.c_void_p] = []            # events whose copies are done
        self._pending: deque[tuple[ctypes.c_void_p, list[torch.Tensor]]] = deque()  # (event, host sources)
        # host sources of the calls since the last event, the stream their copies ran on, how many calls
        self._held: list[torch.Tensor] = []
        self._held_stream = 0
        self._held_calls = 0

    def copy(self, copies: list[Copy], host_sources: list[torch.Tensor]) -> None:
        lib = self.lib
        stream = _current_stream(self.device)
        for dst, src, n, from_host in copies:
            if n:
                copy = lib.cuMemcpyHtoDAsync_v2 if from_host else lib.cuMemcpyDtoDAsync_v2
                err = copy(dst, src, n, stream)
                if err == _INVALID_CONTEXT:  # a thread without a current context
                    make_context_current(self.device)
                    err = copy(dst, src, n, stream)
                if err:
                    _check(err, "cuMemcpy" + ("HtoD" if from_host else "DtoD"))
        if host_sources:
            if self._held and stream != self._held_stream:  # an event on one stream covers its copies only
                self._seal()
            self._held_stream = stream
            self._held += host_sources
            self._held_calls += 1
            if self._held_calls >= RELEASE_EVERY:
                self._seal()
                self._release()

    def _seal(self) -> None:
        """Record an event after the held sources' copies; they are released once it completes."""
        event = self._free.pop() if self._free else self._new_event()
        _check(self.lib.cuEventRecord(event, self._held_stream), "cuEventRecord")
        self._pending.append((event, self._held))
        self._held, self._held_calls = [], 0

    def _new_event(self) -> ctypes.c_void_p:
        event = ctypes.c_void_p()
        _check(self.lib.cuEventCreate(ctypes.byref(event), _EVENT_DISABLE_TIMING), "cuEventCreate")
        return event

    def _release(self) -> None:
        """Drop the host sources of every copy that has run."""
        while self._pending:
            event, _ = self._pending[0]
            err = self.lib.cuEventQuery(event)
            if err == _NOT_READY:
                return
            _check(err, "cuEventQuery")
            self._pending.popleft()
            self._free.append(event)

    def __del__(self) -> None:
        # the host sources still referenced must not be freed under a copy in flight
        try:
            if self._held:
                self._seal()
            for event, _ in self._pending:
                self.lib.cuEventSynchronize(event)
        except Exception:  # noqa: BLE001 -- at interpreter exit the driver may be gone
            pass


def tensor_copy(dst: torch.Tensor, src: torch.Tensor) -> Copy | None:
    """``dst[:len(src)].copy_(src)`` (``dst`` on a GPU) as one byte copy, when both are
    contiguous, of one dtype, ``src`` is on the host or ``dst``'s GPU, and ``src``'s rows are a
    prefix of ``dst``'s (or the shapes are equal); None when it needs PyTorch's ``copy_``."""
    rows = dst.shape == src.shape or (dst.dim() > 0 and dst.dim() == src.dim() and dst.shape[1:] == src.shape[1:]
                                      and src.shape[0] <= dst.shape[0])
    if dst.dtype != src.dtype or not rows or not (dst.is_contiguous() and src.is_contiguous()):
        return None
    from_host = src.is_cpu
    if not from_host and src.get_device() != dst.get_device():  # another GPU: a peer copy
        return None
    return dst.data_ptr(), src.data_ptr(), src.nbytes, from_host
