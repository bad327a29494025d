"""Asynchronous copies through the CUDA driver, for ``ember.cuda_graph``'s copy into its buffers.

A captured step replays in about 25 µs of GPU time, so its host path must stay below that for
the GPU to be fed back to back. PyTorch's ``copy_`` costs 15-30 µs of host time a call on the
GPU machines' hosts (dispatch, stream and pinned-memory bookkeeping) where the driver's
``cuMemcpyAsync`` costs a few: the copies into a capture's static buffers go through the driver
on PyTorch's current stream, which the replay then runs on.

A host source must outlive its asynchronous copy (from pinned memory the copy runs later, and
the tensor's block may be handed out again once the caller drops it): like PyTorch's host
allocator, ``DriverCopies`` records an event after the copies and keeps the host tensors alive
until it has completed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from .cuda_backend import _check, _current_stream, _driver, _streams, make_context_current

Copy = tuple[int, int, int]  # (destination address, source address, bytes)
RELEASE_EVERY = 8  # host sources held before asking which copies have run (one query per call is host time)


class DriverCopies:
    """Copies on ``device``'s current stream with ``cuMemcpyAsync``; host sources kept alive."""

    def __init__(self, device: torch.device):
        self.driver = _driver()
        self.device = device.index if device.index is not None else torch.cuda.current_device()
        self._free: list[Any] = []                        # events whose copies are done
        self._pending: deque[tuple[Any, list[torch.Tensor]]] = deque()  # (event, host sources)

    def copy(self, copies: list[Copy], host_sources: list[torch.Tensor]) -> None:
        d = self.driver
        raw = _current_stream(self.device)
        stream = _streams.get(raw)
        if stream is None:
            stream = _streams[raw] = d.CUstream(raw)
        for dst, src, n in copies:
            if n:
                (err,) = d.cuMemcpyAsync(dst, src, n, stream)
                if err == d.CUresult.CUDA_ERROR_INVALID_CONTEXT:  # a thread without a current context
                    make_context_current(self.device)
                    (err,) = d.cuMemcpyAsync(dst, src, n, stream)
                _check(d, err, "cuMemcpyAsync")
        if host_sources:
            if len(self._pending) >= RELEASE_EVERY:
                self._release()
            event = self._free.pop() if self._free else self._new_event()
            _check(d, d.cuEventRecord(event, stream)[0], "cuEventRecord")
            self._pending.append((event, host_sources))

    def _new_event(self) -> Any:
        err, event = self.driver.cuEventCreate(self.driver.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        _check(self.driver, err, "cuEventCreate")
        return event

    def _release(self) -> None:
        """Drop the host sources of every copy that has run."""
        d = self.driver
        while self._pending:
            event, _ = self._pending[0]
            (err,) = d.cuEventQuery(event)
            if err == d.CUresult.CUDA_ERROR_NOT_READY:
                return
            _check(d, err, "cuEventQuery")
            self._pending.popleft()
            self._free.append(event)

    def __del__(self) -> None:
        # the host sources still referenced must not be freed under a copy in flight
        try:
            for event, _ in self._pending:
                self.driver.cuEventSynchronize(event)
        except Exception:  # noqa: BLE001 -- at interpreter exit the driver may be gone
            pass


def tensor_copy(dst: torch.Tensor, src: torch.Tensor) -> Copy | None:
    """``dst[:len(src)].copy_(src)`` as one byte copy, when both are contiguous, of one dtype,
    and ``src``'s rows are a prefix of ``dst``'s (or the shapes are equal); None when it needs
    PyTorch's ``copy_``."""
    rows = dst.shape == src.shape or (dst.dim() > 0 and dst.dim() == src.dim() and dst.shape[1:] == src.shape[1:]
                                      and src.shape[0] <= dst.shape[0])
    if dst.dtype != src.dtype or not rows or not (dst.is_contiguous() and src.is_contiguous()):
        return None
    return dst.data_ptr(), src.data_ptr(), src.nbytes
