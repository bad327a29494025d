"""Build a graph's CPU kernels: one C++ module per graph, each kernel bound as a ctypes function.

If the module fails to build, each kernel is built on its own to find the ones at fault; those
run through ATen (one warning each) and the rest are built together without them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..codegen.cpp import render_module, uses_error_flag
from ..config import Config, log
from ..schedule.kernel_ir import Kernel
from . import cpp_build, stats
from .program import bind_kernel


@dataclass
class BuiltKernels:
    functions: dict[str, Any] = field(default_factory=dict)   # kernel name -> callable
    failed: dict[str, str] = field(default_factory=dict)      # kernel name -> compiler output
    module_source: str = ""


def _build_module(kernels: list[Kernel], cfg: Config) -> tuple[dict[str, Any], str]:
    source = render_module(kernels)
    path, cached = cpp_build.build(source, cfg)
    stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
    log(1, f"{'loaded' if cached else 'built'} {len(kernels)} CPU kernel(s) from {path}", cfg)
    lib = cpp_build.load(path)
    fns = {}
    for k in kernels:
        fns[k.name] = bind_kernel(lib, k.name, len(k.params), len(k.sizes), uses_error_flag(k))
    fns["__lib__"] = lib  # keep the library loaded as long as its functions live
    return fns, source


def build_cpu_kernels(kernels: list[Kernel], cfg: Config) -> BuiltKernels:
    result = BuiltKernels()
    if not kernels:
        return result
    try:
        result.functions, result.module_source = _build_module(kernels, cfg)
        return result
    except cpp_build.BuildError as whole:
        log(1, f"module build failed, retrying kernel by kernel:\n{whole}", cfg)
    good: list[Kernel] = []
    for k in kernels:
        try:
            cpp_build.build(render_module([k]), cfg)
            good.append(k)
        except cpp_build.BuildError as e:
            result.failed[k.name] = str(e)
            stats.bump("build_failures")
            warnings.warn(f"ember: kernel {k.name} failed to build; its ops run through ATen "
                          f"instead.\n{str(e)[-1500:]}", RuntimeWarning, stacklevel=2)
    if good:
        result.functions, result.module_source = _build_module(good, cfg)
    return result

