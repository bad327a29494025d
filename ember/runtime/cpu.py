"""The CPU backend: a graph's kernels as one C++ module, each kernel a ctypes function."""

from __future__ import annotations

from ..codegen import cpp
from ..config import Config, log
from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel
from . import cpp_build, stats
from .backend import Backend, BuiltKernels
from .program import bind_kernel


class CppBackend(Backend):
    name = "cpp"
    pass_tensors = False

    def render(self, kernel: Kernel) -> str:
        return cpp.render_kernel(kernel)

    def render_module(self, kernels: list[Kernel]) -> str:
        return cpp.render_module(kernels)

    def uses_error_flag(self, kernel: Kernel) -> bool:
        return cpp.uses_error_flag(kernel)

    def build_module(self, kernels: list[Kernel], cfg: Config, fallbacks: dict | None = None) -> BuiltKernels:
        source = self.render_module(kernels)
        path, cached = cpp_build.build(source, cfg)
        try:
            lib = cpp_build.load(path)
        except OSError:
            if not cached:
                raise
            # a cached library that does not load (another machine's, copied with its stamp): build
            # it again, over it (or in a stand-in directory where the cache is read-only)
            path, cached = cpp_build.build(source, cfg, again=True)
            lib = cpp_build.load(path)
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'built'} {len(kernels)} CPU kernel(s) from {path}", cfg)
        functions = {k.name: bind_kernel(lib, k.name, len(k.params), [sh.is_float_symbol(s) for s in k.sizes],
                                           self.uses_error_flag(k))
                     for k in kernels}
        return BuiltKernels(functions, module_source=source, keepalive=[lib])
