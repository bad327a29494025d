"""Launching compiled Triton kernels through the CUDA driver, without Triton's launcher.

Triton launches a kernel through a small C extension that it generates for each new argument
signature and builds with the host's C compiler: about 0.4 s per signature, the largest part of a
cold compile for a graph whose kernels take new argument lists. ember launches the compiled cubin
itself with ``cuLaunchKernel``. The argument list follows Triton's ABI: the non-constexpr
arguments in order, then the global and profile scratch pointers.

The launch goes through PyTorch's own C++ launcher (``torch._C._StaticCudaLauncher``, Inductor's)
where this torch has it, given the tensors' addresses as integers (a tensor would cost it a driver
query per pointer). Profiling a GPT step, Inductor's launches through it took 12.7 µs each, and
ember's through cuda-python's ``cuLaunchKernel`` from ctypes slots 31 (bench/RESULTS.md). That
path remains the fallback, and the path for a thread whose current context is another device's.

Kernels this path cannot launch (scratch memory, clusters, cooperative or programmatic launches,
tensor descriptors, no cuda-python) keep Triton's own launcher.
"""

from __future__ import annotations

import ctypes
import operator
import threading
from collections.abc import Callable
from typing import Any

import torch

from .cuda_backend import _check, _driver, make_context_current

# the static launcher's letter for each argument type (pointers: 'O', an address as an int)
_TYPE_LETTERS = {
    ctypes.c_void_p: "O", ctypes.c_int8: "b", ctypes.c_int16: "h", ctypes.c_int32: "i", ctypes.c_int64: "l",
    ctypes.c_uint8: "B", ctypes.c_uint16: "H", ctypes.c_uint32: "I", ctypes.c_uint64: "K", ctypes.c_float: "f",
    ctypes.c_double: "d",
}


def _static_launch() -> Any:
    """PyTorch's C++ kernel launcher (CUDA builds of torch 2.7 and later), or None."""
    launcher = getattr(torch._C, "_StaticCudaLauncher", None)
    return getattr(launcher, "_launch_kernel", None)


_SCALARS: dict[str, Any] = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float,
    "fp64": ctypes.c_double,
}


def argument_layout(signature: dict[str, str]) -> list[tuple[int, Any]] | None:
    """(position among all arguments, ctypes type) of each argument the kernel receives; pointers
    as ``c_void_p``. None when some argument type is one this launcher does not pass."""
    layout = []
    for i, ty in enumerate(signature.values()):
        if ty == "constexpr":
            continue
        if isinstance(ty, str) and ty.startswith("*"):
            layout.append((i, ctypes.c_void_p))
        elif ty in _SCALARS:
            layout.append((i, _SCALARS[ty]))
        else:
            return None
    return layout


def direct_launcher(kernel: Any, device: int) -> DirectLauncher | None:
    """A launcher for a compiled Triton kernel (``JITFunction.run(..., warmup=True)``), or None
    where Triton's own must be used."""
    meta = kernel.metadata
    if (getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)
            or getattr(meta, "num_ctas", 1) != 1 or getattr(meta, "launch_cooperative_grid", False)
            or getattr(meta, "launch_pdl", False) or getattr(meta, "tensordesc_meta", None)):
        return None
    layout = argument_layout(dict(kernel.src.signature))
    if layout is None:
        return None
    try:
        driver = _driver()
    except Exception:  # noqa: BLE001 -- no cuda-python: Triton's launcher
        return None
    return DirectLauncher(kernel, layout, driver, device)


class DirectLauncher:
    def __init__(self, kernel: Any, layout: list[tuple[int, Any]], driver: Any, device: int):
        from triton.runtime.driver import driver as triton_driver

        self.name = kernel.name
        self.driver = driver
        self.device = device
        make_context_current(device)
        # Triton's own loader: sets the dynamic shared memory limit the kernel needs
        _module, function, _regs, _spills, max_threads = triton_driver.active.utils.load_binary(
            kernel.name, kernel.kernel, kernel.metadata.shared, device)
        self.threads = 32 * kernel.metadata.num_warps
        if self.threads > max_threads:
            raise RuntimeError(f"{kernel.name}: {self.threads} threads, the kernel allows {max_threads}")
        self.function = driver.CUfunction(function)
        self.function_handle = int(function)
        self.num_warps = kernel.metadata.num_warps
        self.shared = kernel.metadata.shared
        self._static = _static_launch()
        self.argument_letters = "".join(_TYPE_LETTERS[kind] for _, kind in layout) + "OO"  # (+ the scratches)
        self.layout = [(i, ctypes.c_void_p is kind) for i, kind in layout]
        self.positions = [i for i, _ in layout]
        # (the launch's values in one C call, not a Python loop: a 208-tensor combo's arguments)
        self._values = _picker(self.positions)
        self._slots = [kind() for _, kind in layout] + [ctypes.c_void_p(0), ctypes.c_void_p(0)]  # scratch
        self._argv = (ctypes.c_void_p * len(self._slots))(*[ctypes.addressof(s) for s in self._slots])
        self._argv_address = ctypes.addressof(self._argv)
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, grid_x: int, grid_y: int, stream: int, args: tuple[Any, ...]) -> None:
        if self._static is not None and self._launch_static(grid_x, grid_y, stream, tuple(
                [args[i].data_ptr() if pointer and isinstance(args[i], torch.Tensor) else args[i]
                 for i, pointer in self.layout] + [None, None])):
            return
        self._launch_through_cuda_python(grid_x, grid_y, stream, args)

    def launch_addresses(self, grid_x: int, grid_y: int, stream: int, args: tuple[Any, ...]) -> None:
        """``__call__`` with every pointer argument given as its address already (the launcher
        took them for the call's specialization): no tensor looked at twice."""
        if self._static is not None and self._launch_static(grid_x, grid_y, stream, self._values(args) + (None, None)):
            return
        self._launch_through_cuda_python(grid_x, grid_y, stream, args)

    def _launch_static(self, grid_x: int, grid_y: int, stream: int, values: tuple[Any, ...]) -> bool:
        """Through PyTorch's C++ launcher; False where it failed and the driver path must launch."""
        try:
            self._static(self.function_handle, grid_x, grid_y, 1, self.num_warps, self.shared,
                         self.argument_letters, values, stream)
            return True
        except RuntimeError:
            # A thread with no current context gets device 0's from it, where another device's
            # kernel fails: the driver path, with this device's context, launches it or reports
            # the error.
            make_context_current(self.device)
            return False

    def _launch_through_cuda_python(self, grid_x: int, grid_y: int, stream: int, args: tuple[Any, ...]) -> None:
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = self.driver.CUstream(stream)
        with self._lock:
            slots = self._slots
            for slot, (i, pointer) in zip(slots, self.layout):
                value = args[i]
                slot.value = value.data_ptr() if pointer and isinstance(value, torch.Tensor) else value
            (err,) = self.driver.cuLaunchKernel(self.function, grid_x, grid_y, 1, self.threads, 1, 1, self.shared,
                                                handle, self._argv_address, 0)
            if err == self.driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:  # a thread without a current context
                make_context_current(self.device)
                (err,) = self.driver.cuLaunchKernel(self.function, grid_x, grid_y, 1, self.threads, 1, 1,
                                                    self.shared, handle, self._argv_address, 0)
        _check(self.driver, err, f"launching {self.name} (grid {grid_x}x{grid_y})")


def _picker(positions: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """args -> the tuple of args at ``positions``."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda args: (args[only],)
    return lambda args: ()
