"""The CUDA backend: a graph's kernels as one CUDA C++ module, compiled with NVRTC for the device's
architecture, loaded and launched through the CUDA driver API (NVIDIA's cuda-python).

Build: the module's source (codegen/cuda.py) is compiled to a cubin by NVRTC (``nvcc -cubin`` when
NVRTC's Python bindings are missing), cached on disk as ``<key>.cu`` and ``<key>.cubin`` under
``cache_dir/cuda``, the key a hash of source, architecture, compiler version and options; the
cubin's SHA-256 beside it (``<key>.sha256``) sends a damaged one to be built again.
The build compiles each kernel's 32-bit-index entry point; the 64-bit ones (``EMBER_WIDE_INDEX``)
are compiled, as a second module from the same source, at the first launch whose flat indices
reach 2^31 (a failure there sends that kernel's ops through ATen, with one warning).
Load: ``cuModuleLoadData`` in the device's primary context, the one PyTorch's runtime uses.
Launch: each kernel's callable takes the wrapper's ``(data_ptr()..., sizes...)``, computes its grid
from the sizes and the device's SM count, and calls ``cuLaunchKernel`` on PyTorch's current stream:
no host synchronisation, no allocation (a full reduction's workspace and counter are allocated
once per device and stream).

cuda-python API assumptions (cuda-bindings 12.x/13.x): every call returns a tuple whose first item
is the CUresult / nvrtcResult; ``cuLaunchKernel``'s ``kernelParams`` may be an int, the address of
a ``void*[]`` of argument addresses (as in cuda-python's own examples); ``cuModuleLoadData`` takes
the image's address as an int; ``hStream`` may be a plain int (a ``cudaStream_t``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..codegen import cuda, cuda_combos, cuda_matmul
from ..config import DEFAULT_CUDA_COMPILE_TIMEOUT, Config, log
from ..schedule.kernel_ir import Kernel
from . import cache_dirs, cpp_build, stats
from .backend import Backend, BuildError, BuiltKernels, CompileTimeout, fall_back, run_compiler
from .cuda_launch import cdiv, plan_launch

NEEDS_CUDA_PYTHON = "the CUDA backend needs NVIDIA's cuda-python (cuda-bindings): pip install cuda-python"
# IEEE division/sqrt and accurate math: no --use_fast_math; and no a * b + c contracted into one
# rounding, as eager computes a fused chain's ops apart (runtime/triton_matmul.py: FP_FUSION)
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false")
WIDE_INDEX = "-DEMBER_WIDE_INDEX"  # builds the 64-bit-index entry points (codegen/cuda.py)


# ---- cuda-python ----------------------------------------------------------------------------

@functools.cache
def _driver() -> Any:
    """``cuda.bindings.driver`` (cuda-python >= 12.6), or the older ``cuda.cuda``, initialised."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # cuda-python < 12.6
        except ImportError as e:
            raise BuildError(f"{NEEDS_CUDA_PYTHON} ({e})") from None
    try:
        _check(driver, driver.cuInit(0)[0], "cuInit")
    except RuntimeError as e:
        raise BuildError(f"the CUDA driver is not usable: {e}") from None
    return driver


def _nvrtc() -> Any | None:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python < 12.6
        except ImportError:
            return None
    return nvrtc


def _check(driver: Any, err: Any, what: str) -> None:
    if err != driver.CUresult.CUDA_SUCCESS:
        name = driver.cuGetErrorName(err)[1]
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")


# ---- compiling ------------------------------------------------------------------------------

@functools.cache
def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found = shutil.which("nvcc") or str(Path(home) / "bin" / "nvcc")
    return found if Path(found).exists() else None


@functools.cache
def compiler_id() -> str:
    """The compiler that builds cubins, with its version: part of the cache key."""
    nvrtc = _nvrtc()
    if nvrtc is not None:
        err, major, minor = nvrtc.nvrtcVersion()
        if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return f"nvrtc {major}.{minor}"
    nvcc = _nvcc()
    if nvcc is None:
        raise BuildError("no CUDA compiler: install NVRTC (pip install nvidia-cuda-nvrtc) or put nvcc on the PATH")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    return f"nvcc {out.splitlines()[-1] if out else nvcc}"


def cache_key(source: str, arch: str, compiler: str, options: tuple[str, ...] = NVRTC_OPTIONS) -> str:
    h = hashlib.sha256()
    for part in (source, arch, compiler, " ".join(options)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def compile_module(source: str, arch: str, cache_dir: Path, wide: bool = False,
                   timeout: float = DEFAULT_CUDA_COMPILE_TIMEOUT) -> tuple[bytes, bool, Path]:
    """The cubin of ``source`` for ``arch`` (e.g. 'sm_90'): (image, came_from_cache, path); with
    ``wide``, of its 64-bit-index entry points. A compile that takes more than ``timeout``
    seconds is a BuildError, and is remembered beside the cache (``<key>.timeout``, holding
    the limit): a later process with that limit or a lower one fails at once, not after
    waiting again."""
    compiler = compiler_id()
    options = NVRTC_OPTIONS + ((WIDE_INDEX,) if wide else ())
    path = Path(cache_dir) / "cuda" / f"{cache_key(source, arch, compiler, options)}.cubin"
    if cpp_build.intact(path):  # (its hash beside it, as the CPU libraries': a damaged one is built again)
        return path.read_bytes(), True, path
    # (a temporary directory of this process where cache_dir cannot be written: cache_dirs.py)
    writable = cache_dirs.writable_part(cache_dir, "cuda") / path.name
    if cpp_build.intact(writable):
        return writable.read_bytes(), True, writable
    for marker in {path.with_suffix(".timeout"), writable.with_suffix(".timeout")}:
        earlier = _timed_out_after(marker)
        if earlier is not None and timeout <= earlier:
            raise BuildError(f"{compiler} did not finish compiling this CUDA module for {arch} within "
                             f"{earlier:g} s in an earlier run ({marker}); not trying again with a limit of "
                             f"{timeout:g} s (ember option cuda_compile_timeout, EMBER_CUDA_COMPILE_TIMEOUT)")
    path = writable
    try:
        if compiler.startswith("nvrtc"):
            image = _on_a_thread(timeout, _compile_nvrtc, source, arch, options)
        else:  # (a process, stopped at the limit)
            image = _compile_nvcc(source, arch, options, timeout=timeout)
    except CompileTimeout as e:
        _write_atomic(path.with_suffix(".timeout"), f"{timeout!r}\n".encode())
        _write_atomic(path.with_suffix(".cu"), source.encode())  # (to look at, or report)
        raise BuildError(f"{compiler} did not finish compiling a CUDA module for {arch} within {timeout:g} s "
                         f"(ember option cuda_compile_timeout, EMBER_CUDA_COMPILE_TIMEOUT); its source is "
                         f"{path.with_suffix('.cu')} ({e})") from None
    _write_atomic(path.with_suffix(".cu"), source.encode())
    _write_atomic(cpp_build.stamp_path(path), hashlib.sha256(image).hexdigest().encode())
    _write_atomic(path, image)
    return image, False, path


def _timed_out_after(marker: Path) -> float | None:
    """The limit an earlier compile of this module ran past, if one did."""
    try:
        return float(marker.read_text().strip())
    except (OSError, ValueError):
        return None


def _on_a_thread(timeout: float, compile_with: Callable[..., bytes], *args: Any) -> bytes:
    """``compile_with(*args)``, or CompileTimeout after ``timeout`` seconds. NVRTC runs in this
    process (and releases the GIL) but cannot be stopped: it runs on a daemon thread, and one
    that runs past the limit is left to finish on its own, its result dropped."""
    result: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            result["image"] = compile_with(*args)
        except BaseException as e:  # noqa: BLE001 -- raised on the calling thread below
            result["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name="ember-cuda-compile", daemon=True).start()
    if not done.wait(timeout):
        raise CompileTimeout("NVRTC goes on in the background; its result will not be used")
    if "error" in result:
        raise result["error"]
    return result["image"]


def _compile_nvrtc(source: str, arch: str, options: tuple[str, ...] = NVRTC_OPTIONS) -> bytes:
    nvrtc = _nvrtc()
    ok = nvrtc.nvrtcResult.NVRTC_SUCCESS
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"ember_kernels.cu", 0, [], [])
    if err != ok:
        raise BuildError(f"nvrtcCreateProgram failed: {err}")
    try:
        flags = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in options)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        if err != ok:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            text = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, text)
            raise BuildError(f"NVRTC failed to compile for {arch}:\n{text.decode(errors='replace')[-4000:]}")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        image = b" " * size
        (err2,) = nvrtc.nvrtcGetCUBIN(prog, image)
        if err != ok or err2 != ok:
            raise BuildError(f"NVRTC produced no cubin for {arch}: {err}, {err2}")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile_nvcc(source: str, arch: str, options: tuple[str, ...] = NVRTC_OPTIONS,
                  timeout: float = DEFAULT_CUDA_COMPILE_TIMEOUT) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ember-cuda-") as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.cubin"
        src.write_text(source)
        run_compiler([_nvcc(), "-cubin", f"-arch={arch}", *options, "-o", str(out), str(src)], timeout=timeout)
        return out.read_bytes()


# ---- loading --------------------------------------------------------------------------------

_contexts: dict[int, Any] = {}
_context_lock = threading.Lock()


def make_context_current(device: int) -> None:
    """Make ``device``'s primary context (the one PyTorch's runtime uses) current on this thread."""
    driver = _driver()
    err, current = driver.cuCtxGetCurrent()
    if err == driver.CUresult.CUDA_SUCCESS and int(current) != 0:
        err, ordinal = driver.cuCtxGetDevice()
        if err == driver.CUresult.CUDA_SUCCESS and int(ordinal) == device:
            return
    with _context_lock:
        if device not in _contexts:
            err, dev = driver.cuDeviceGet(device)
            _check(driver, err, "cuDeviceGet")
            err, ctx = driver.cuDevicePrimaryCtxRetain(dev)
            _check(driver, err, "cuDevicePrimaryCtxRetain")
            _contexts[device] = ctx
    _check(driver, driver.cuCtxSetCurrent(_contexts[device])[0], "cuCtxSetCurrent")


def launch(driver: Any, device: int, *args: Any) -> Any:
    """``cuLaunchKernel(*args)``, making ``device``'s context current first on a thread that has
    none; the CUresult."""
    (err,) = driver.cuLaunchKernel(*args)
    if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        make_context_current(device)
        (err,) = driver.cuLaunchKernel(*args)
    return err


class CudaModule:
    """A cubin, loaded lazily into each device that launches its kernels."""

    def __init__(self, image: bytes, names: list[str]):
        self.image = image
        self.names = names
        self._loaded: dict[int, tuple[Any, dict[str, tuple[Any, int]]]] = {}
        self._lock = threading.Lock()

    def functions(self, device: int) -> dict[str, tuple[Any, int]]:
        """name -> (CUfunction, the most threads a block of it can have) on ``device``."""
        loaded = self._loaded.get(device)
        if loaded is None:
            with self._lock:
                if device not in self._loaded:
                    self._loaded[device] = self._load(device)
                loaded = self._loaded[device]
        return loaded[1]

    def _load(self, device: int) -> tuple[Any, dict[str, tuple[Any, int]]]:
        driver = _driver()
        with torch.cuda.device(device):
            torch.cuda.current_stream(device)  # the runtime's primary context exists from here on
            make_context_current(device)
            buf = ctypes.create_string_buffer(self.image, len(self.image))
            err, module = driver.cuModuleLoadData(ctypes.addressof(buf))
            _check(driver, err, "cuModuleLoadData")
            out = {}
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
            for name in self.names:
                err, fn = driver.cuModuleGetFunction(module, name.encode())
                _check(driver, err, f"cuModuleGetFunction({name})")
                err, max_threads = driver.cuFuncGetAttribute(attr, fn)
                _check(driver, err, f"cuFuncGetAttribute({name})")
                out[name] = (fn, int(max_threads))
        return module, out


class WideModule:
    """The 64-bit-index entry points of a built module's source, compiled (or loaded from the
    cache) and loaded at the first launch that needs one: most programs never do. A failed
    compile is remembered and raised again for every kernel that asks."""

    def __init__(self, source: str, arch: str, names: list[str], cfg: Config):
        self.source, self.arch, self.names, self.cfg = source, arch, names, cfg
        self._module: CudaModule | None = None
        self._error: BuildError | None = None
        self._lock = threading.Lock()

    def function(self, device: int, name: str) -> Any:
        with self._lock:
            if self._module is None and self._error is None:
                try:
                    image, cached, path = compile_module(self.source, self.arch, Path(self.cfg.cache_dir), wide=True,
                                                         timeout=self.cfg.cuda_compile_timeout)
                    log(1, f"{'loaded' if cached else 'built'} 64-bit-index CUDA kernels for {self.arch} from {path}",
                        self.cfg)
                    self._module = CudaModule(image, self.names)
                except BuildError as e:
                    self._error = e
            if self._error is not None:
                raise self._error
        try:
            return self._module.functions(device)[name][0]
        except RuntimeError as e:  # a cubin the driver refuses
            raise BuildError(str(e)) from None


# ---- launching ------------------------------------------------------------------------------

# What Inductor's generated code calls per launch: PyTorch's current device and raw cudaStream_t,
# without building Python Device/Stream objects (public APIs as the fallback).
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
if hasattr(torch._C, "_cuda_getCurrentRawStream"):
    _current_stream = torch._C._cuda_getCurrentRawStream
else:
    def _current_stream(device: int) -> int:
        return torch.cuda.current_stream(device).cuda_stream


_streams: dict[int, Any] = {}


def stream_handle(driver: Any, raw: int) -> Any:
    """A cudaStream_t as a CUstream, one handle kept per stream (no conversion inside
    cuLaunchKernel)."""
    stream = _streams.get(raw)
    if stream is None:
        stream = _streams[raw] = driver.CUstream(raw)
    return stream


class CudaKernel:
    """Launches one generated kernel from the wrapper's (pointers..., sizes...) call.

    A many-block full reduction has a workspace and counter per device and stream, so launches
    of the same kernel on two streams at once do not count each other's blocks."""

    def __init__(self, name: str, meta: dict[str, Any], module: CudaModule, wide: WideModule,
                 fallback: Callable[..., None] | None = None):
        self.name = name
        self.meta = meta
        self.strategy = meta["strategy"]
        self.module = module
        self.wide = wide
        self.fallback = fallback  # the group through ATen, if the 64-bit entry point fails to build
        self.failed = False
        self.n_params = meta["n_params"]
        args = ", ".join(meta["sizes"])
        self.outer = eval(f"lambda {args}: {meta['outer']}")  # noqa: S307 -- our own generated expression
        self.inner = eval(f"lambda {args}: {meta['inner']}")  # noqa: S307
        # Arguments live in ctypes slots whose addresses form the void*[] cuLaunchKernel reads; a
        # launch writes the values in place (the driver copies them before cuLaunchKernel returns).
        # The tensors' addresses are one array, written with one slice assignment (an Adam step's
        # combo takes 208: a loop setting each slot's value took twice as long).
        self._pointers = (ctypes.c_uint64 * max(1, self.n_params))()
        self._slots: list[Any] = [ctypes.c_double() if f else ctypes.c_int64() for f in meta.get("float_sizes", [])]
        if meta["workspace"]:
            self._slots += [ctypes.c_void_p(), ctypes.c_void_p()]
        first = ctypes.addressof(self._pointers)
        addresses = [first + 8 * i for i in range(self.n_params)] + [ctypes.addressof(s) for s in self._slots]
        self._argv = (ctypes.c_void_p * max(1, len(addresses)))(*addresses)
        self._argv_address = ctypes.addressof(self._argv)
        self._devices: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _device_state(self, device: int) -> dict[str, Any]:
        fn, max_threads = self.module.functions(device)[self.meta["kernels"]["i32"]]
        # (the 64-bit entry point, None until a launch needs it, has the same launch bounds)
        state = {"functions": [fn, None], "max_threads": max_threads,
                 "sms": torch.cuda.get_device_properties(device).multi_processor_count,
                 "geometry": {}, "workspaces": {}, "resident": {}}
        self._devices[device] = state
        return state

    def _resident(self, state: dict[str, Any], big: bool, block: int) -> int:
        """Blocks of ``block`` threads the device runs at once, by the kernel's registers and
        shared memory (the driver's occupancy), which ``balanced_grid`` sizes grids by. 0 on a
        driver error (the plan then counts threads and blocks per SM alone)."""
        key = (big, block)
        if key not in state["resident"]:
            driver = _driver()
            err, per_sm = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(state["functions"][big], block, 0)
            ok = err == driver.CUresult.CUDA_SUCCESS and per_sm > 0
            state["resident"][key] = state["sms"] * per_sm if ok else 0
        return state["resident"][key]

    def _workspace(self, state: dict[str, Any], device: int, stream: int, slots: int,
                   counters: int) -> tuple[Any, ...]:
        """The stream's workspace, with at least ``slots`` partials and ``counters`` counters. One
        partial per block and reduction (a split column kernel's: per slice, row and reduction);
        counters start at 0 and each count's last block resets its own. A launch needing more
        gets a larger one; the smaller stays alive, as a captured CUDA graph may launch with it."""
        held = state["workspaces"].get(stream)  # (workspace, counters, their addresses, their sizes)
        if held is not None and held[4] >= slots and held[5] >= counters:
            return held
        if held is not None:
            state.setdefault("retired", []).append(held)
            slots, counters = max(slots, 2 * held[4]), max(counters, held[5])
        ws = torch.empty(slots, dtype=torch.float64, device=f"cuda:{device}")
        counter = torch.zeros(counters, dtype=torch.int32, device=f"cuda:{device}")
        state["workspaces"][stream] = (ws, counter, ws.data_ptr(), counter.data_ptr(), slots, counters)
        return state["workspaces"][stream]

    def __call__(self, *args: Any) -> None:
        if self.failed:
            self.fallback(*args)
            return
        n = self.n_params
        sizes = args[n:]
        outer, inner = int(self.outer(*sizes)), int(self.inner(*sizes))
        if outer == 0 and not (self.meta.get("chunks") or self.meta.get("row_reductions")):
            return  # (with no rows, a chunked kernel still zeroes its partials, a reduction over the
            # rows still stores its neutral result)
        device = _current_device()
        state = self._devices.get(device) or self._device_state(device)
        geometry = state["geometry"].get((outer, inner))
        if geometry is None:
            if len(state["geometry"]) > 4096:  # many distinct dynamic sizes: start over
                state["geometry"].clear()
            big = outer * inner >= 2**31
            if big and state["functions"][1] is None:
                try:
                    state["functions"][1] = self.wide.function(device, self.meta["kernels"]["i64"])
                except BuildError as e:
                    fall_back(self, f"CUDA kernel {self.name}", e, args)
                    return
            big, grid, block = plan_launch(self.strategy, outer, inner, state["sms"], state["max_threads"],
                                           self.meta.get("vector", 1),
                                           occupancy=lambda block: self._resident(state, big, block),
                                           row_groups=self.meta.get("row_groups", False),
                                           tile=self.meta.get("tile", 64),
                                           split=self.meta.get("split_columns", False)
                                           or self.meta.get("split_rows", False),
                                           lanes=self.meta.get("lanes", 1))
            if self.meta.get("chunks"):  # a chunked row kernel: a block per run of rows
                grid = self.meta["chunks"]
            if self.meta.get("row_reductions"):  # a workspace slot per block
                grid = min(grid, cuda.MAX_BLOCKS)
            gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
            bx, by = block if isinstance(block, tuple) else (block, 1)
            # workspace: a slot per block and reduction, or per slice, row and reduction
            partials = max(1, self.meta["n_reductions"]) * max(cuda.MAX_BLOCKS, gy * outer if gy > 1 else 0)
            counters = (outer if self.strategy == "rows" else cdiv(outer, 32)) if gy > 1 else 1
            geometry = state["geometry"][(outer, inner)] = (state["functions"][big], gx, gy, bx, by, partials, counters)
        fn, gx, gy, bx, by, partials, counters = geometry
        driver = _driver()
        raw = _current_stream(device)
        stream = stream_handle(driver, raw)
        with self._lock:
            slots = self._slots
            if n:
                self._pointers[:n] = args[:n]
            for slot, value in zip(slots, sizes):
                slot.value = value
            if self.meta["workspace"]:
                ws = self._workspace(state, device, raw, partials, counters)
                slots[-2].value, slots[-1].value = ws[2], ws[3]
            err = launch(driver, device, fn, gx, gy, 1, bx, by, 1, 0, stream, self._argv_address, 0)
        _check(driver, err, f"launching {self.name} (grid {gx} x {gy}, block {bx} x {by})")


def _render(kernel: Kernel) -> str:
    return cuda_combos.render_combo(kernel) if kernel.parts else cuda.render_kernel(kernel)


class CudaBackend(Backend):
    name = "cuda"
    pass_tensors = False

    def passes_tensors(self, kernel: Kernel) -> bool:
        return bool(kernel.dots)  # (the Hopper matmul launcher: runtime/cuda_matmul.py)

    def render(self, kernel: Kernel) -> str:
        if kernel.dots:  # a matmul and its epilogue: the Hopper template
            try:
                return cuda_matmul.render_kernel(kernel)
            except cuda_matmul.MatmulRenderError as e:
                return f"// {kernel.name}: {e}; runs through ATen"
        return _render(kernel)

    def render_module(self, kernels: list[Kernel]) -> str:
        matmuls = [k for k in kernels if k.dots]
        rest = [k for k in kernels if not k.dots]
        return "\n".join(([cuda.render_module(rest)] if rest else [])
                         + ([cuda_matmul.render_module(matmuls)] if matmuls else []))

    def build_module(self, kernels: list[Kernel], cfg: Config,
                     fallbacks: dict[str, Callable[..., None]] | None = None) -> BuiltKernels:
        """Compile (or load from the cache) and load the module; compile and load errors are
        BuildErrors. ``fallbacks`` serve a kernel whose 64-bit entry point, built at its first
        launch that needs it, does not build."""
        _driver()  # a clear BuildError without cuda-python, before any work
        if not torch.cuda.is_available():
            raise BuildError("the CUDA backend needs a CUDA device (torch.cuda.is_available() is False)")
        matmuls = [k for k in kernels if k.dots]
        if matmuls:  # a module of their own, for sm_90a (runtime/cuda_matmul.py)
            from .cuda_matmul import build
            try:
                built = build(matmuls, cfg, fallbacks)
            except cuda_matmul.MatmulRenderError as e:
                raise BuildError(str(e)) from None
            rest = [k for k in kernels if not k.dots]
            return built.merge(self.build_module(rest, cfg, fallbacks)) if rest else built
        device = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
        sources = [_render(k) for k in kernels]  # (no matmul here: those were taken out)
        source = cuda.render_module(kernels, sources)
        image, cached, path = compile_module(source, arch, Path(cfg.cache_dir), timeout=cfg.cuda_compile_timeout)
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'built'} {len(kernels)} CUDA kernel(s) for {arch} from {path}", cfg)
        metas = {k.name: cuda_combos.combo_meta(k) if k.parts else cuda.launch_meta(k) for k in kernels}
        module = CudaModule(image, [m["kernels"]["i32"] for m in metas.values()])
        try:
            module.functions(device)  # load now: a cubin the driver refuses is a build failure
        except RuntimeError as e:
            raise BuildError(str(e)) from None
        wide = WideModule(source, arch, [m["kernels"]["i64"] for m in metas.values()], cfg)
        functions = {k.name: CudaKernel(k.name, metas[k.name], module, wide, (fallbacks or {}).get(k.name))
                     for k in kernels}
        return BuiltKernels(functions, module_source=source, keepalive=[module, wide],
                            sources={k.name: s for k, s in zip(kernels, sources)})
