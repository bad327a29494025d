"""Building and launching the Hopper matmul kernels (codegen/cuda_matmul.py).

Both GPU backends use them: the CUDA backend for every matmul kernel, the Triton backend for the
kernels of one matmul (or two sharing A) on a Hopper GPU, where the ping-pong kernel hides the
epilogue that Triton's leaves the tensor cores waiting for (bench/RESULTS.md). The module is
compiled for sm_90a by NVRTC (nvcc without it), cached like the CUDA backend's modules, in the
background where ``background_compile`` allows (``build``).

A launch builds the operands' TMA descriptors (``cuTensorMapEncodeTiled``; the last few are
kept, keyed by address, dims and stride, so a loop over the same tensors encodes nothing) and
launches a block per SM on PyTorch's current stream. A call whose operands TMA cannot read (an
address or row stride not a multiple of 16 bytes) or that has no K runs through ATen instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import ctypes
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..codegen import cuda_matmul
from ..config import Config, log
from ..schedule.kernel_ir import Kernel
from . import stats
from .backend import BuildError, BuiltKernels, fall_back
from .cuda_backend import CudaModule, _check, _current_stream, _driver, compile_module, launch, stream_handle
from .triton_matmul import FIRST_WAIT_S, submit_compile

MAPS_KEPT = 32  # tensor maps kept per kernel (operands seen recently)


@functools.cache
def hopper_device(device: int) -> bool:
    """Can ``device`` run the Hopper kernels: compute capability 9.0, cuda-python importable."""
    try:
        if torch.cuda.get_device_capability(device) != (9, 0):
            return False
        _driver()
    except (RuntimeError, BuildError, AssertionError):
        return False
    return True


def on_hopper(kernel: Kernel) -> bool:
    """Does the Triton backend hand ``kernel`` to the Hopper template: a matmul kernel the
    template computes (one product, or two sharing A), and the current GPU a Hopper one."""
    return (bool(kernel.dots) and cuda_matmul.takes(kernel) is None and torch.cuda.is_available()
            and hopper_device(torch.cuda.current_device()))


def build(kernels: list[Kernel], cfg: Config, fallbacks: dict[str, Callable[..., None]] | None) -> BuiltKernels:
    """Compile (or load from the cache) and load the module of ``kernels``; compile and load
    errors are BuildErrors. The host program passes these kernels tensors, with either backend:
    a call TMA cannot serve runs the group through ATen, which needs them.

    NVRTC takes 0.3-0.7 s for these kernels (their epilogues are unrolled over a tile), so with
    ``background_compile`` a module not in the cache compiles in the background pool, as
    Triton's matmul kernels do (NVRTC releases the GIL): calls run their group through ATen until
    it is ready (``ember.wait_for_kernels()`` waits), and a compile that fails then falls back
    with one warning."""
    _driver()
    device = torch.cuda.current_device()
    if not hopper_device(device):
        raise BuildError(f"the Hopper matmul kernels need a compute capability 9.0 GPU, not "
                         f"{torch.cuda.get_device_name(device)}")
    source = cuda_matmul.render_module(kernels)
    fallbacks = fallbacks or {}

    def compile_and_load() -> CudaModule:
        image, cached, path = compile_module(source, cuda_matmul.ARCH, Path(cfg.cache_dir),
                                             timeout=cfg.cuda_compile_timeout)
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'built'} {len(kernels)} Hopper matmul kernel(s) from {path}", cfg)
        module = CudaModule(image, [k.name for k in kernels])
        try:
            module.functions(device)
        except RuntimeError as e:
            raise BuildError(str(e)) from None
        return module

    if cfg.background_compile and all(fallbacks.get(k.name) for k in kernels):
        job = submit_compile(compile_and_load)
        cf.wait([job], timeout=FIRST_WAIT_S)  # (a cached module is ready by then)
        module = job.result() if job.done() else job
    else:
        module = compile_and_load()
    functions = {k.name: HopperMatmul(k.name, cuda_matmul.launch_meta(k), module, fallbacks.get(k.name))
                 for k in kernels}
    return BuiltKernels(functions, module_source=source, keepalive=[module])


class HopperMatmul:
    """The callable the host program launches a Hopper matmul kernel through."""

    def __init__(self, name: str, meta: dict[str, Any], module: CudaModule | cf.Future,
                 fallback: Callable[..., None] | None):
        self.name, self.meta, self.module, self.fallback = name, meta, module, fallback
        self.failed = False
        args = ", ".join(meta["sizes"])
        shape = lambda *exprs: eval(f"lambda {args}: ({', '.join(exprs)},)")  # noqa: E731, S307 -- our own expressions
        self.mnk = shape(meta["m"], meta["n"], meta["k"])
        self.operand_dims = [shape(o["offset"], o["stride"], o["rows"], o["cols"]) for o in meta["operands"]]
        self.operand_index = [meta["params"].index(o["param"]) for o in meta["operands"]]
        self.n_params = len(meta["params"])
        driver = _driver()
        self.dtype = (driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 if meta["dtype"] == "bfloat16"
                      else driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16)
        # the argument slots: the operands' tensor maps (filled per call: A's, then each B's), then
        # the kernel's params and sizes
        n_maps = len(meta["operands"])
        self._slots: list[Any] = [ctypes.c_void_p() for _ in range(self.n_params)]
        self._slots += [ctypes.c_double() if f else ctypes.c_int64() for f in meta["float_sizes"]]
        self._argv = (ctypes.c_void_p * (n_maps + len(self._slots)))(
            *[0] * n_maps, *[ctypes.addressof(s) for s in self._slots])
        self._maps: dict[tuple[int, ...], Any] = {}
        self._devices: dict[int, tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def _function(self, device: int) -> tuple[Any, int]:
        fn = self.module.functions(device)[self.name][0]
        driver = _driver()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(driver, driver.cuFuncSetAttribute(fn, attr, self.meta["smem"])[0], f"shared memory of {self.name}")
        state = self._devices[device] = (fn, torch.cuda.get_device_properties(device).multi_processor_count)
        return state

    def _map(self, address: int, rows: int, cols: int, stride: int, box: tuple[int, int]) -> Any:
        key = (address, rows, cols, stride, *box)
        tmap = self._maps.get(key)
        if tmap is None:
            d = _driver()
            err, tmap = d.cuTensorMapEncodeTiled(
                self.dtype, 2, address, [d.cuuint64_t(cols), d.cuuint64_t(rows)], [d.cuuint64_t(stride * 2)],
                [d.cuuint32_t(box[0]), d.cuuint32_t(box[1])], [d.cuuint32_t(1), d.cuuint32_t(1)],
                d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
                d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
                d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
            _check(d, err, f"cuTensorMapEncodeTiled for {self.name}")
            if len(self._maps) >= MAPS_KEPT:
                self._maps.clear()
            self._maps[key] = tmap
        return tmap

    def __call__(self, *args: Any) -> None:
        if self.failed:
            self.fallback(*args)
            return
        if isinstance(self.module, cf.Future) and self._compiling(args):
            return
        n = self.n_params
        sizes = args[n:]
        m, nn, k = self.mnk(*sizes)
        if m == 0 or nn == 0:
            return
        addresses = [a.data_ptr() for a in args[:n]]
        maps = []
        for index, dims, operand in zip(self.operand_index, self.operand_dims, self.meta["operands"]):
            offset, stride, rows, cols = dims(*sizes)
            address = addresses[index] + 2 * offset
            if address % 16 or (stride * 2) % 16 or k == 0 or stride < cols:
                self._through_aten(args)  # TMA cannot read it (or there is nothing to sum)
                return
            maps.append((address, rows, cols, stride, operand["box"]))
        try:
            self._launch(addresses, sizes, maps, m, nn)
        except (RuntimeError, BuildError) as e:
            fall_back(self, f"Hopper matmul kernel {self.name}", e, args)

    def _compiling(self, args: tuple[Any, ...]) -> bool:
        """Is the module still compiling in the background (this call then ran through ATen)?
        Once it is done, its module (or its failure: one warning, then ATen from then on)."""
        if not self.module.done():
            stats.bump("calls_while_compiling")
            self.fallback(*args)
            return True
        try:
            self.module = self.module.result()
        except (BuildError, RuntimeError) as e:
            fall_back(self, f"Hopper matmul kernel {self.name}", e, args)
            return True
        return False

    def _through_aten(self, args: tuple[Any, ...]) -> None:
        if self.fallback is None:
            raise RuntimeError(f"{self.name}: operands the Hopper kernel cannot read (TMA needs 16-byte aligned "
                               "addresses and rows) and no ATen fallback")
        stats.bump("matmuls_through_aten")
        self.fallback(*args)

    def _launch(self, addresses: list[int], sizes: tuple[Any, ...], maps: list[tuple[Any, ...]],
                m: int, n: int) -> None:
        device = torch.cuda.current_device()
        fn, sms = self._devices.get(device) or self._function(device)
        driver = _driver()
        tiles = -(-m // self.meta["tile"][0]) * -(-n // self.meta["tile"][1])
        stream = stream_handle(driver, _current_stream(device))
        with self._lock:
            tmaps = [self._map(*mp) for mp in maps]  # (held until the launch: the cache may drop them)
            for i, tmap in enumerate(tmaps):
                self._argv[i] = tmap.getPtr()
            for slot, value in zip(self._slots, [*addresses, *sizes]):
                slot.value = value
            err = launch(driver, device, fn, min(sms, tiles), 1, 1, cuda_matmul.THREADS, 1, 1, self.meta["smem"],
                         stream, ctypes.addressof(self._argv), 0)
        _check(driver, err, f"launching {self.name}")
