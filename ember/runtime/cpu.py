"""The CPU backend: a graph's kernels as one C++ module, each kernel a ctypes function."""

from __future__ import annotations

from ..codegen import cpp
from ..config import Config, log
from ..ir import shapes as sh
from ..schedule.kernel_ir import Kernel
from . import cpp_build, stats
from .backend import Backend, BuildError, BuiltKernels
from .program import bind_kernel

# (compiler, flags, cache directory) -> why no kernel builds with them, or None: asked once
_toolchain_problems: dict[tuple, str | None] = {}


class CppBackend(Backend):
    name = "cpp"
    pass_tensors = False

    def render(self, kernel: Kernel) -> str:
        return cpp.render_kernel(kernel)

    def render_module(self, kernels: list[Kernel]) -> str:
        return cpp.render_module(kernels)

    def uses_error_flag(self, kernel: Kernel) -> bool:
        return cpp.uses_error_flag(kernel)

    def toolchain_problem(self, cfg: Config) -> str | None:
        # an empty module: what every kernel's build needs (the compiler, its flags, the prelude)
        key = (cfg.cxx, cfg.cxx_flags, str(cfg.cache_dir))
        if key not in _toolchain_problems:
            try:
                cpp_build.build(cpp.PRELUDE + '\nextern "C" void ember_toolchain_probe(void) {}\n', cfg,
                                prelude=cpp.PRELUDE)
                _toolchain_problems[key] = None
            except BuildError as e:
                _toolchain_problems[key] = str(e)
            except OSError:
                return None  # (nowhere to build it: each kernel tells)
        return _toolchain_problems[key]

    def build_module(self, kernels: list[Kernel], cfg: Config, fallbacks: dict | None = None) -> BuiltKernels:
        sources = [cpp.render_kernel(k) for k in kernels]
        source = cpp.render_module(kernels, sources)
        path, cached = cpp_build.build(source, cfg, prelude=cpp.PRELUDE)
        try:
            lib = cpp_build.load(path)
        except OSError:
            if not cached:
                raise
            # a cached library that does not load (another machine's, copied with its stamp): build
            # it again, over it (or in a stand-in directory where the cache is read-only)
            path, cached = cpp_build.build(source, cfg, again=True, prelude=cpp.PRELUDE)
            lib = cpp_build.load(path)
        stats.bump("cache_hits" if cached else "kernels_built", len(kernels))
        log(1, f"{'loaded' if cached else 'built'} {len(kernels)} CPU kernel(s) from {path}", cfg)
        functions = {k.name: bind_kernel(lib, k.name, len(k.params), [sh.is_float_symbol(s) for s in k.sizes],
                                           self.uses_error_flag(k))
                     for k in kernels}
        return BuiltKernels(functions, module_source=source, keepalive=[lib],
                            sources={k.name: s for k, s in zip(kernels, sources)})
