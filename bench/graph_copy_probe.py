"""What the host parts of a graphed step cost: the driver's copies (``cuMemcpyAsync`` against the
direction-specific calls ``ember.cuda_graph`` makes), an event, a replay; and whether the copy
costs less inside the graph: a host memmove into a pinned staging buffer that the graph itself
copies from (an event recorded inside the graph after that copy tells the host when the buffer
may be written again). Measured on an H200's host (2026-11-26): it does not, because a graph
with a copy node and an event takes 3.5 µs longer to launch than the memmove saves.

    PYTHONPATH=. python bench/graph_copy_probe.py
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import synced_us  # noqa: E402

from ember.runtime.cuda_backend import _current_stream
from ember.runtime.driver_copies import DriverCopies, _libcuda

NBYTES = 24 * 1024


def host_us(fn, n: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def main() -> None:
    lib = _libcuda()
    src = torch.empty(NBYTES, dtype=torch.uint8).pin_memory()
    staging = torch.empty(NBYTES, dtype=torch.uint8).pin_memory()
    dst = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda")
    work = torch.zeros(2048, 4, device="cuda")
    pageable = torch.empty(NBYTES, dtype=torch.uint8)
    dst2 = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda")
    htod, dtod = lib.cuMemcpyHtoDAsync_v2, lib.cuMemcpyDtoDAsync_v2
    lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
    copier = DriverCopies(torch.device("cuda"))
    stream = torch.cuda.Stream()

    def kernels():
        for _ in range(3):
            work.mul_(1.0001)

    def capture(with_copy: bool):
        g = torch.cuda.CUDAGraph()
        ev = torch.cuda.Event(external=True) if with_copy else None
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernels()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(g, stream=stream):
            if with_copy:
                dst.copy_(staging, non_blocking=True)
                ev.record()
            kernels()
        return g, ev

    g_plain, _ = capture(False)
    g_copy, ev = capture(True)
    ev_ptr = ctypes.c_void_p(ev.cuda_event)

    one_copy = [(dst.data_ptr(), src.data_ptr(), NBYTES, True)]

    def driver_step():
        copier.copy(one_copy, [src])
        g_plain.replay()

    def staged_step():
        if lib.cuEventQuery(ev_ptr) != 0:
            lib.cuEventSynchronize(ev_ptr)
        ctypes.memmove(staging.data_ptr(), src.data_ptr(), NBYTES)
        g_copy.replay()

    src.fill_(7)
    staged_step()
    torch.cuda.synchronize()
    assert int(dst[0]) == 7 and int(dst[-1]) == 7, "the staged copy did not run"
    rows = [
        ("current raw stream", host_us(lambda: _current_stream(0))),
        ("cuMemcpyAsync 24 KB pinned", host_us(lambda: lib.cuMemcpyAsync(dst.data_ptr(), src.data_ptr(), NBYTES,
                                                                          _current_stream(0)))),
        ("cuMemcpyHtoDAsync 24 KB pinned", host_us(lambda: htod(dst.data_ptr(), src.data_ptr(), NBYTES,
                                                                   _current_stream(0)))),
        ("cuMemcpyHtoDAsync 24 KB pageable", host_us(lambda: htod(dst.data_ptr(), pageable.data_ptr(), NBYTES,
                                                                     _current_stream(0)))),
        ("cuMemcpyHtoDAsync 64 B pinned", host_us(lambda: htod(dst.data_ptr(), src.data_ptr(), 64,
                                                                _current_stream(0)))),
        ("cuMemcpyDtoDAsync 24 KB", host_us(lambda: dtod(dst.data_ptr(), dst2.data_ptr(), NBYTES,
                                                          _current_stream(0)))),
        ("cuEventRecord", host_us(lambda: lib.cuEventRecord(ev_ptr, _current_stream(0)))),
        ("DriverCopies.copy (copy + event)", host_us(lambda: copier.copy(one_copy, [src]))),
        ("memmove 24 KB", host_us(lambda: ctypes.memmove(staging.data_ptr(), src.data_ptr(), NBYTES))),
        ("cuEventQuery", host_us(lambda: lib.cuEventQuery(ev_ptr))),
        ("replay (3 kernels)", host_us(g_plain.replay)),
        ("replay (copy + event + 3 kernels)", host_us(g_copy.replay)),
        ("driver copy + replay, host", host_us(driver_step)),
        ("staged memmove + replay, host", host_us(staged_step)),
        ("driver copy + replay, synced", synced_us(driver_step)),
        ("staged memmove + replay, synced", synced_us(staged_step)),
    ]
    n = 100
    for name, step in (("driver", driver_step), ("staged", staged_step)):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        rows.append((f"{name}, {n} back to back, per step", (time.perf_counter() - t) * 1e6 / n))
    for name, us in rows:
        print(f"{name:40s} {us:8.2f} us")


if __name__ == "__main__":
    main()
