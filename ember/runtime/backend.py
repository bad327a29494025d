"""What every kernel backend provides, and which one a graph uses.

A backend renders kernel IR to source (``render`` for one kernel, ``render_module`` for a graph's
translation unit) and builds a module into callables. Each callable takes the kernel's parameters
in order (tensors when ``pass_tensors``, else raw ``data_ptr()`` ints), then its size symbols.
Backends: 'cpp' (CPU, C++/OpenMP), 'triton' and 'cuda' (NVIDIA GPUs).
"""

from __future__ import annotations

import importlib
import subprocess
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import GPU_BACKENDS, Config, log
from ..schedule.kernel_ir import Kernel
from . import stats


class BuildError(RuntimeError):
    """A kernel (or module) failed to build; its ops run through ATen instead."""


class CompileTimeout(BuildError):
    """A compiler ran past its time limit."""


def run_compiler(cmd: list[str], timeout: float) -> None:
    """Run a compiler's command line; a failure is a BuildError with its command (and the end
    of its errors), a timeout a CompileTimeout (the compiler is stopped)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CompileTimeout(f"{' '.join(cmd)} timed out after {timeout:g} s; it was stopped") from e
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")


@dataclass
class BuiltKernels:
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)  # kernel -> callable
    failed: dict[str, str] = field(default_factory=dict)                    # kernel -> why
    module_source: str = ""
    keepalive: list[Any] = field(default_factory=list)  # libraries/modules the callables need
    # kernel -> its source as rendered into module_source (a report shows it: not rendered again)
    sources: dict[str, str] = field(default_factory=dict)

    def merge(self, other: BuiltKernels) -> BuiltKernels:
        """These kernels and ``other``'s (two modules of one graph), in one BuiltKernels."""
        self.functions.update(other.functions)
        self.failed.update(other.failed)
        self.sources.update(other.sources)
        self.module_source = "\n".join(s for s in (other.module_source, self.module_source) if s)
        self.keepalive += other.keepalive
        return self


class Backend(ABC):
    name = "?"
    pass_tensors = False

    @abstractmethod
    def render(self, kernel: Kernel) -> str:
        """Source of one kernel, as a report shows it."""

    @abstractmethod
    def render_module(self, kernels: list[Kernel]) -> str:
        """The translation unit holding a graph's kernels."""

    @abstractmethod
    def build_module(self, kernels: list[Kernel], cfg: Config,
                     fallbacks: dict[str, Callable[..., None]] | None = None) -> BuiltKernels:
        """Build all ``kernels`` as one module; raise BuildError if it does not build.
        ``fallbacks`` run a kernel's group through ATen with the kernel's own arguments, for
        backends that only find out at the first launch that a kernel does not compile."""

    def uses_error_flag(self, kernel: Kernel) -> bool:
        return False

    def toolchain_problem(self, cfg: Config) -> str | None:
        """Why no kernel at all can build here (no compiler, one that fails on an empty
        module), or None: asked after a module failed to build."""
        return None

    def passes_tensors(self, kernel: Kernel) -> bool:
        """Does the host program pass ``kernel`` tensors (else ``data_ptr()`` ints)?"""
        return self.pass_tensors

    def build(self, kernels: list[Kernel], cfg: Config,
              fallbacks: dict[str, Callable[..., None]] | None = None) -> BuiltKernels:
        """Build the module; if that fails, find the kernels at fault by building each alone,
        warn once per failed kernel, and build the rest together. Where no kernel can build
        (``toolchain_problem``), one warning for them all."""
        if not kernels:
            return BuiltKernels()
        try:
            return self.build_module(kernels, cfg, fallbacks)
        except BuildError as whole:
            log(1, f"{self.name} module build failed, retrying kernel by kernel:\n{whole}", cfg)
        # (a missing or broken compiler warned once per kernel of every graph, each built alone)
        problem = self.toolchain_problem(cfg)
        if problem is not None:
            stats.bump("build_failures", len(kernels))
            warnings.warn(f"ember: no {self.name} kernel can be built here, so this graph's {len(kernels)} kernel(s) "
                          f"failed to build; their ops run through ATen instead.\n{problem[-1500:]}",
                          RuntimeWarning, stacklevel=3)
            return BuiltKernels(failed={k.name: problem for k in kernels})
        good: list[Kernel] = []
        failed: dict[str, str] = {}
        for k in kernels:
            try:
                self.build_module([k], cfg, fallbacks)
                good.append(k)
            except BuildError as e:
                failed[k.name] = str(e)
                stats.bump("build_failures")
                warnings.warn(f"ember: kernel {k.name} failed to build ({self.name}); its ops run "
                              f"through ATen instead.\n{str(e)[-1500:]}", RuntimeWarning, stacklevel=3)
        built = self.build_module(good, cfg, fallbacks) if good else BuiltKernels()
        built.failed.update(failed)
        return built


def fall_back(launcher: Any, kernel: str, error: Exception, args: tuple[Any, ...]) -> None:
    """A kernel failed to compile or launch at its first call: one warning (and a build failure
    counted), then this call and every later one through the launcher's ATen ``fallback``
    (``launcher.failed``); re-raises ``error`` when the launcher has none."""
    if launcher.fallback is None:
        raise error
    launcher.failed = True
    stats.bump("build_failures")
    warnings.warn(f"ember: {kernel} failed to compile or launch ({type(error).__name__}: {str(error)[-1500:]}); "
                  "its ops run through ATen instead.", RuntimeWarning, stacklevel=3)
    launcher.fallback(*args)


_BACKENDS = {"cpp": "ember.runtime.cpu:CppBackend", "triton": "ember.runtime.triton_backend:TritonBackend",
             "cuda": "ember.runtime.cuda_backend:CudaBackend"}
_instances: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    if name not in _BACKENDS:
        raise ValueError(f"unknown ember backend {name!r}; choose one of {sorted(_BACKENDS)}")
    if name not in _instances:
        module, cls = _BACKENDS[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]


def backend_name(device: str, cfg: Config) -> str:
    """The backend for a graph on ``device``: C++ on the CPU, ``cfg.gpu_backend`` on GPUs."""
    if device.startswith("cuda"):
        if cfg.gpu_backend not in GPU_BACKENDS:
            raise ValueError(f"gpu_backend must be one of {GPU_BACKENDS}, got {cfg.gpu_backend!r}")
        return cfg.gpu_backend
    if device == "cpu":
        return "cpp"
    raise NotImplementedError(f"ember has no kernel backend for device {device!r}")
